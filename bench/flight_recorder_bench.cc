// loom_bench_flight_recorder: what the flight recorder adds to each
// operation (record at the call, started, finished: what group.cc does per
// operation; one entry recorded done: what the latency path does), with
// the default 2000 entries and switched off (0), single thread. Compare the ns/op with an 8-byte AllReduce's time from
// all_reduce_perf (microseconds) for the recorder's share of it: an
// end-to-end A/B of two all_reduce_perf runs at 8 bytes varies by more than
// the recorder costs on a shared 2-core machine.
#include <benchmark/benchmark.h>

#include "core/flight_recorder.h"

namespace {

void BM_RecordStartFinish(benchmark::State& state) {
  loom::core::FlightRecorder recorder(size_t(state.range(0)));
  loom::core::FlightRecorder::Entry e;
  e.kind = "AllReduce";
  e.type = "float";
  e.op = "sum";
  e.count = 2;
  for (auto _ : state) {
    ++e.seq;
    ++e.collSeq;
    const uint64_t id = recorder.record(e);
    recorder.started(id);
    recorder.finished(id, true);
    benchmark::DoNotOptimize(id);
  }
  state.SetLabel(state.range(0) == 0 ? "recorder off" : "2000 entries");
}
BENCHMARK(BM_RecordStartFinish)->Arg(0)->Arg(2000);

// What the latency path records per call: one entry, done, at the end.
void BM_RecordDone(benchmark::State& state) {
  loom::core::FlightRecorder recorder(size_t(state.range(0)));
  loom::core::FlightRecorder::Entry e;
  e.kind = "Broadcast";
  e.type = "float";
  e.count = 2;
  e.root = 0;
  for (auto _ : state) {
    ++e.seq;
    ++e.collSeq;
    benchmark::DoNotOptimize(recorder.record(e, loom::core::FlightRecorder::State::kDone));
  }
  state.SetLabel(state.range(0) == 0 ? "recorder off" : "2000 entries");
}
BENCHMARK(BM_RecordDone)->Arg(0)->Arg(2000);

}  // namespace

BENCHMARK_MAIN();
