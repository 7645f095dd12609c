#include "core/planner.h"

#include <algorithm>
#include <cstdio>

#include "kernels/datatype.h"

namespace loom::core {

Range partition(size_t count, int n, int i, size_t align) {
  size_t per = (count + size_t(n) - 1) / size_t(n);
  per = (per + align - 1) / align * align;
  Range r;
  r.begin = std::min(count, per * size_t(i));
  r.end = std::min(count, r.begin + per);
  return r;
}

size_t sliceCount(size_t maxElems, size_t elemSize, size_t sliceBytes) {
  size_t perSlice = std::max<size_t>(1, sliceBytes / elemSize);
  return std::max<size_t>(1, (maxElems + perSlice - 1) / perSlice);
}

Range slice(Range part, size_t maxElems, size_t nslices, size_t s) {
  size_t per = (maxElems + nslices - 1) / nslices;
  Range r;
  r.begin = std::min(part.end, part.begin + per * s);
  r.end = std::min(part.end, r.begin + per);
  return r;
}

namespace {

Result<Plan> planOneChannel(const OpDesc& op, const PlanParams& params) {
  if (params.algorithm == Algorithm::kTwoShot && op.kind == OpKind::kAllReduce) return allReduceTwoShot(op, params);
  if (params.algorithm == Algorithm::kDoubling && op.kind == OpKind::kAllReduce) return allReduceDoubling(op, params);
  if (params.algorithm == Algorithm::kHalving && op.kind == OpKind::kAllReduce) return allReduceHalving(op, params);
  if (params.algorithm == Algorithm::kHierarchical && op.kind == OpKind::kAllReduce)
    return allReduceHierarchical(op, params);
  if (params.algorithm == Algorithm::kTree) {
    if (op.kind == OpKind::kAllReduce) return allReduceTree(op, params);
    if (op.kind == OpKind::kBroadcast) return broadcastTree(op, params);
    if (op.kind == OpKind::kReduce) return reduceTree(op, params);
  }
  if (params.algorithm == Algorithm::kDirect) {
    switch (op.kind) {
      case OpKind::kAllReduce: return allReduceDirect(op, params);
      case OpKind::kAllGather: return allGatherDirect(op, params);
      case OpKind::kReduceScatter: return reduceScatterDirect(op, params);
      case OpKind::kBroadcast: return broadcastDirect(op, params);
      case OpKind::kReduce: return reduceDirect(op, params);
      default: break;
    }
  }
  switch (op.kind) {
    case OpKind::kAllReduce: return allReduceRing(op, params);
    case OpKind::kAllGather: return allGatherRing(op, params);
    case OpKind::kReduceScatter: return reduceScatterRing(op, params);
    case OpKind::kBroadcast: return broadcastChain(op, params);
    case OpKind::kReduce: return reduceChain(op, params);
    default:
      return internalError(std::string("planCollective called for ") + opKindName(op.kind));
  }
}

// Collectives whose result at element i depends only on element i of the
// inputs: each channel can run the one-channel plan on a contiguous part.
bool elementwise(OpKind k) { return k == OpKind::kAllReduce || k == OpKind::kBroadcast || k == OpKind::kReduce; }

Result<Plan> planChannels(const OpDesc& op, const PlanParams& params) {
  const size_t es = kernels::dataTypeSize(op.type);
  const size_t bytes = op.count * es;
  int channels = std::max(1, params.channels);
  if (!elementwise(op.kind) || params.nranks == 1) channels = 1;
  const size_t fit = std::max<size_t>(1, bytes / std::max<size_t>(1, params.channelMinBytes));
  channels = int(std::min(size_t(channels), fit));
  if (channels == 1) return planOneChannel(op, params);
  // Channel c runs the whole algorithm on part c of the vector, on its own
  // connections: the parts' buffer places shift by the part's start.
  Plan plan;
  const size_t align = std::max<size_t>(1, 4096 / es);
  for (int c = 0; c < channels; ++c) {
    const Range part = partition(op.count, channels, c, align);
    if (part.size() == 0) continue;
    OpDesc sub = op;
    sub.count = part.size();
    PlanParams channel = params;
    channel.ringIndex = c;
    LOOM_ASSIGN_OR_RETURN(Plan p, planOneChannel(sub, channel));
    if (plan.streams.empty()) {
      plan.rank = p.rank;
      plan.nranks = p.nranks;
      plan.nbuffers = p.nbuffers;
      plan.algorithm = p.algorithm;
    }
    for (Stream& st : p.streams) {
      st.channel = c;
      for (Step& step : st.steps) {
        for (BufRef* ref : {&step.local, &step.out})
          if (ref->valid()) ref->offset += part.begin * es;
      }
      plan.streams.push_back(std::move(st));
    }
  }
  return plan;
}

}  // namespace

Result<Plan> planCollective(const OpDesc& op, const PlanParams& params) {
  LOOM_ASSIGN_OR_RETURN(Plan plan, planChannels(op, params));
  plan.hostRanks = hostRanksOf(params);
  return plan;
}

int hostRanksOf(const PlanParams& params) {
  if (params.hostOf.empty()) return params.nranks;
  return int(std::count(params.hostOf.begin(), params.hostOf.end(), params.hostOf[size_t(params.rank)]));
}

std::string stepName(const Step& s) {
  bool recv = s.recvPeer >= 0, send = s.sendPeer >= 0;
  if (!s.fanIn.empty()) return send ? "fanInSend" : "fanIn";
  if (!recv) return send ? "send" : "copy";
  if (s.reduce) return send ? (s.out.valid() ? "recvReduceCopySend" : "recvReduceSend")
                            : "recvReduceCopy";
  return send ? "recvCopySend" : "recv";
}

std::string dumpPlan(const Plan& plan) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "plan %s rank %d/%d, %zu stream(s)\n", plan.algorithm,
                plan.rank, plan.nranks, plan.streams.size());
  out += line;
  for (size_t c = 0; c < plan.streams.size(); ++c) {
    for (const Step& s : plan.streams[c].steps) {
      std::snprintf(line, sizeof line,
                    "  [%zu] ch%d %-18s recv<-%d send->%d local=%d+%zu out=%d+%zu bytes=%zu%s%s\n", c,
                    plan.streams[c].channel, stepName(s).c_str(), s.recvPeer, s.sendPeer, s.local.buf,
                    s.local.offset, s.out.buf, s.out.offset, s.bytes, s.post ? " post" : "",
                    s.singleCopy ? " single-copy" : "");
      out += line;
      if (!s.fanIn.empty()) {
        out += "      fold:";
        for (size_t i = 0; i <= s.fanIn.size(); ++i) {
          if (int(i) == s.localAt) out += " local";
          if (i < s.fanIn.size()) out += " " + std::to_string(s.fanIn[i]);
        }
        out += "\n";
      }
    }
  }
  return out;
}

}  // namespace loom::core
