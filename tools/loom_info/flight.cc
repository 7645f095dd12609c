#include "flight.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/flight_recorder.h"

namespace loom::info {
namespace {

using core::jsonQuoted;

// One line of the file: a flat JSON object of strings and integers.
using Fields = std::map<std::string, std::string>;

bool parseFlat(const std::string& line, Fields* out) {
  size_t i = 0;
  auto skip = [&] {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
  };
  auto str = [&](std::string* s) {
    if (i >= line.size() || line[i] != '"') return false;
    ++i;
    s->clear();
    while (i < line.size() && line[i] != '"') {
      if (line[i] == '\\' && i + 1 < line.size()) {
        ++i;
        if (line[i] == 'u' && i + 4 < line.size()) {
          s->push_back(char(std::strtol(line.substr(i + 1, 4).c_str(), nullptr, 16)));
          i += 4;
        } else {
          s->push_back(line[i]);
        }
      } else {
        s->push_back(line[i]);
      }
      ++i;
    }
    if (i >= line.size()) return false;
    ++i;
    return true;
  };
  skip();
  if (i >= line.size() || line[i++] != '{') return false;
  for (;;) {
    skip();
    if (i < line.size() && line[i] == '}') return true;
    std::string key, value;
    if (!str(&key)) return false;
    skip();
    if (i >= line.size() || line[i++] != ':') return false;
    skip();
    if (i < line.size() && line[i] == '"') {
      if (!str(&value)) return false;
    } else {
      while (i < line.size() && line[i] != ',' && line[i] != '}') value.push_back(line[i++]);
      while (!value.empty() && value.back() == ' ') value.pop_back();
    }
    (*out)[key] = value;
    skip();
    if (i < line.size() && line[i] == ',') {
      ++i;
      continue;
    }
    if (i < line.size() && line[i] == '}') return true;
    return false;
  }
}

struct Op {
  long long seq = 0;
  long long coll = 0;  // 0: point-to-point
  std::string kind, count, type, op, root, state;
  long long enqueueUs = 0, startUs = 0, endUs = 0;
  std::string signature() const {
    return kind + " " + count + " x " + type + (op.empty() ? "" : " " + op) + (root == "-1" ? "" : " root " + root);
  }
};

struct RankFile {
  std::string path, host, pid, reason;
  int rank = -1, nranks = 0;
  std::vector<Op> ops;
  // The newest collective called / finished (collective numbers).
  long long collCalled() const {
    long long c = 0;
    for (const auto& o : ops) c = std::max(c, o.coll);
    return c;
  }
  long long collDone() const {
    long long c = 0;
    for (const auto& o : ops)
      if (o.state == "done") c = std::max(c, o.coll);
    return c;
  }
  const Op* collective(long long c) const {
    for (const auto& o : ops)
      if (o.coll == c) return &o;
    return nullptr;
  }
  const Op* latest() const { return ops.empty() ? nullptr : &ops.back(); }
};

using Comms = std::map<std::string, std::map<int, RankFile>>;  // comm -> rank -> file

// The flight recorder files in `dir`, by communicator and rank; *files:
// how many were read. Complains about the rest on stderr. False when the
// folder holds none.
bool readFlightFiles(const std::string& dir, Comms* out, size_t* files) {
  DIR* d = opendir(dir.c_str());
  if (!d) {
    std::fprintf(stderr, "loom-info: cannot open %s\n", dir.c_str());
    return false;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind("loom-flight-", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".json") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  Comms& comms = *out;
  size_t bad = 0;
  for (const auto& n : names) {
    RankFile f;
    f.path = dir + "/" + n;
    std::ifstream in(f.path);
    std::string line, comm;
    bool header = true, ok = true;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      Fields fields;
      if (!parseFlat(line, &fields)) {
        ok = false;
        break;
      }
      if (header) {
        if (fields["loom_flight_recorder"] != "1") {
          ok = false;
          break;
        }
        comm = fields["comm"];
        f.rank = std::atoi(fields["rank"].c_str());
        f.nranks = std::atoi(fields["nranks"].c_str());
        if (f.rank < 0 || f.rank >= (1 << 20) || f.nranks <= f.rank || f.nranks > (1 << 20)) {
          ok = false;
          break;
        }
        f.host = fields["host"];
        f.pid = fields["pid"];
        f.reason = fields["reason"];
        header = false;
        continue;
      }
      Op o;
      o.seq = std::atoll(fields["seq"].c_str());
      o.coll = std::atoll(fields["coll"].c_str());
      o.kind = fields["kind"];
      o.count = fields["count"];
      o.type = fields["type"];
      o.op = fields["op"];
      o.root = fields["root"];
      o.state = fields["state"];
      o.enqueueUs = std::atoll(fields["enqueue_us"].c_str());
      o.startUs = std::atoll(fields["start_us"].c_str());
      o.endUs = std::atoll(fields["end_us"].c_str());
      f.ops.push_back(o);
    }
    if (!ok || header) {
      std::fprintf(stderr, "loom-info: %s is not a flight recorder file; skipped\n", f.path.c_str());
      ++bad;
      continue;
    }
    comms[comm][f.rank] = std::move(f);
  }
  if (comms.empty()) {
    std::fprintf(stderr, "loom-info: no flight recorder files (loom-flight-*.json) in %s\n", dir.c_str());
    return false;
  }
  *files = names.size() - bad;
  return true;
}

}  // namespace

int mergeFlight(const std::string& dir) {
  Comms comms;
  size_t files = 0;
  if (!readFlightFiles(dir, &comms, &files)) return 2;
  std::printf("flight recorders in %s: %zu file(s), %zu communicator(s)\n", dir.c_str(), files, comms.size());
  for (const auto& [comm, ranks] : comms) {
    int nranks = 0;
    for (const auto& [r, f] : ranks) {
      if (nranks && f.nranks != nranks) {
        std::printf("  note: the files disagree on the number of ranks (%d and %d)\n", nranks, f.nranks);
      }
      nranks = std::max(nranks, f.nranks);
    }
    std::printf("\ncommunicator %s, %d rank(s)\n", comm.c_str(), nranks);
    std::printf("  %-5s %-16s %-8s %-22s %-28s %s\n", "rank", "host", "pid", "last done", "latest", "why the file");
    std::vector<int> missing;
    for (int r = 0; r < nranks; ++r) {
      auto it = ranks.find(r);
      if (it == ranks.end()) {
        missing.push_back(r);
        if (missing.size() <= 32) std::printf("  %-5d %-16s %-8s %-22s %-28s %s\n", r, "-", "-", "-", "-", "(no file)");
        continue;
      }
      const RankFile& f = it->second;
      const Op* latest = f.latest();
      char done[64] = "-", last[96] = "-";
      for (auto o = f.ops.rbegin(); o != f.ops.rend(); ++o) {
        if (o->state == "done") {
          std::snprintf(done, sizeof done, "%s #%lld", o->kind.c_str(), o->seq);
          break;
        }
      }
      if (latest) std::snprintf(last, sizeof last, "%s #%lld %s", latest->kind.c_str(), latest->seq, latest->state.c_str());
      std::printf("  %-5d %-16s %-8s %-22s %-28s %s\n", r, f.host.c_str(), f.pid.c_str(), done, last,
                  f.reason.substr(0, 60).c_str());
    }
    // Who is behind, counted in collectives (every rank calls them in the
    // same order): a rank that has not called the newest one the others
    // are in; where all called it, one that finished fewer.
    long long called = 0, finished = 0;
    for (const auto& [r, f] : ranks) {
      called = std::max(called, f.collCalled());
      finished = std::max(finished, f.collDone());
    }
    auto latestText = [](const RankFile& f) {
      const Op* l = f.latest();
      return l ? l->kind + " #" + std::to_string(l->seq) + " " + l->state : std::string("nothing");
    };
    std::vector<std::string> behind;
    for (const auto& [r, f] : ranks) {
      if (f.collCalled() < called) {
        behind.push_back("rank " + std::to_string(r) + " (host " + f.host + ", pid " + f.pid +
                         ") has not called collective " + std::to_string(called) + ": its latest is " + latestText(f));
      }
    }
    if (behind.empty()) {
      for (const auto& [r, f] : ranks) {
        if (f.collDone() < finished) {
          behind.push_back("rank " + std::to_string(r) + " (host " + f.host + ", pid " + f.pid +
                           ") finished only up to collective " + std::to_string(f.collDone()) + ": its latest is " +
                           latestText(f));
        }
      }
    }
    std::string where;
    for (const auto& [r, f] : ranks) {
      if (const Op* o = f.collective(called)) {
        where = o->kind + " #" + std::to_string(o->seq) + " on rank " + std::to_string(r);
        break;
      }
    }
    if (called == 0) {
      std::printf("  no collective recorded\n");
    } else if (!behind.empty()) {
      std::printf("  behind (the others reached collective %lld, %s; finished up to collective %lld):\n", called,
                  where.c_str(), finished);
      for (const auto& b : behind) std::printf("    %s\n", b.c_str());
    } else {
      std::printf("  no rank is behind: all reached collective %lld and finished up to %lld\n", called, finished);
    }
    if (!missing.empty()) {
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 64; ++i) list += (list.empty() ? "" : ", ") + std::to_string(missing[i]);
      if (missing.size() > 64) list += " and " + std::to_string(missing.size() - 64) + " more";
      std::printf("  no file from rank(s) %s: dead, hung, or not told where to write (LOOM_FLIGHT_RECORDER_DIR)\n",
                  list.c_str());
    }
    // Different collectives at the same sequence number.
    std::map<long long, std::map<std::string, std::vector<int>>> bySeq;  // by collective number
    for (const auto& [r, f] : ranks)
      for (const auto& o : f.ops)
        if (o.coll > 0) bySeq[o.coll][o.signature()].push_back(r);
    int mismatches = 0;
    for (const auto& [seq, sigs] : bySeq) {
      if (sigs.size() < 2) continue;
      ++mismatches;
      std::printf("  MISMATCH at collective %lld:", seq);
      for (const auto& [sig, rs] : sigs) {
        std::string list;
        for (int r : rs) list += (list.empty() ? "" : ",") + std::to_string(r);
        std::printf(" [rank %s: %s]", list.c_str(), sig.c_str());
      }
      std::printf("\n");
    }
    if (mismatches == 0) std::printf("  every rank called the same collectives in the same order\n");
  }
  return 0;
}

int writeTrace(const std::string& dir, const std::string& path) {
  Comms comms;
  size_t files = 0;
  if (!readFlightFiles(dir, &comms, &files)) return 2;
  // Times count from the earliest operation (its Unix time in otherData).
  long long t0 = 0;
  for (const auto& [comm, ranks] : comms)
    for (const auto& [r, f] : ranks)
      for (const Op& o : f.ops)
        if (o.enqueueUs > 0 && (t0 == 0 || o.enqueueUs < t0)) t0 = o.enqueueUs;
  std::string out = "{\"otherData\":{\"t0_unix_us\":" + std::to_string(t0) +
                    ",\"source\":" + jsonQuoted(dir) + "},\"traceEvents\":[";
  bool firstEvent = true;
  auto emit = [&](const std::string& event) {
    out += (firstEvent ? "\n" : ",\n") + event;
    firstEvent = false;
  };
  // A process per (host, pid); a row per communicator within it.
  std::map<std::pair<std::string, std::string>, int> pids;
  std::map<int, int> rowsOf;
  size_t events = 0;
  struct Stat {
    std::vector<long long> us;
  };
  std::map<std::string, std::map<std::string, Stat>> stats;  // comm -> operation -> durations
  for (const auto& [comm, ranks] : comms) {
    for (const auto& [r, f] : ranks) {
      auto [it, fresh] = pids.try_emplace({f.host, f.pid}, int(pids.size()) + 1);
      const int pid = it->second;
      if (fresh) {
        emit("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
             ",\"args\":{\"name\":" + jsonQuoted("host " + f.host + ", pid " + f.pid) + "}}");
      }
      const int tid = ++rowsOf[pid];
      const std::string where = ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid);
      emit("{\"name\":\"thread_name\",\"ph\":\"M\"" + where + ",\"args\":{\"name\":" +
           jsonQuoted("comm " + comm + " rank " + std::to_string(r) + "/" + std::to_string(f.nranks)) + "}}");
      for (const Op& o : f.ops) {
        const std::string args =
            ",\"args\":{\"seq\":" + std::to_string(o.seq) + ",\"coll\":" + std::to_string(o.coll) +
            ",\"count\":" + jsonQuoted(o.count) + ",\"type\":" + jsonQuoted(o.type) + ",\"op\":" + jsonQuoted(o.op) +
            ",\"root\":" + jsonQuoted(o.root) + ",\"state\":" + jsonQuoted(o.state) +
            (o.startUs > 0 ? ",\"queued_us\":" + std::to_string(o.startUs - o.enqueueUs) : std::string()) + "}";
        const std::string head = "{\"name\":" + jsonQuoted(o.kind) + ",\"cat\":\"loom\"" + where;
        if (o.startUs > 0 && o.endUs > 0) {  // a clock stepped back reads as 0 us
          emit(head + ",\"ph\":\"X\",\"ts\":" + std::to_string(o.startUs - t0) +
               ",\"dur\":" + std::to_string(std::max(0LL, o.endUs - o.startUs)) + args + "}");
          if (o.state == "done") stats[comm][o.signature()].us.push_back(std::max(0LL, o.endUs - o.startUs));
        } else if (o.startUs > 0) {  // still running when the file was written
          emit(head + ",\"ph\":\"B\",\"ts\":" + std::to_string(o.startUs - t0) + args + "}");
        } else {  // queued, or skipped: a mark where it was called
          emit(head + ",\"ph\":\"i\",\"s\":\"t\",\"ts\":" + std::to_string(o.enqueueUs - t0) + args + "}");
        }
        ++events;
      }
    }
  }
  out += "\n]}\n";
  FILE* f = std::fopen(path.c_str(), "w");
  const bool written = f && std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (!f || (std::fclose(f) != 0) | !written) {
    std::fprintf(stderr, "loom-info: cannot write %s\n", path.c_str());
    return 1;
  }
  std::printf("%s: %zu operation(s) from %zu file(s), %zu communicator(s); open it in Perfetto "
              "(ui.perfetto.dev) or chrome://tracing\n",
              path.c_str(), events, files, comms.size());
  // Per operation: how long it ran, over every rank's calls.
  for (auto& [comm, ops] : stats) {
    std::printf("\ncommunicator %s\n  %-44s %8s %12s %12s %12s\n", comm.c_str(), "operation", "calls", "median us",
                "p99 us", "max us");
    for (auto& [sig, st] : ops) {
      std::sort(st.us.begin(), st.us.end());
      const size_t n = st.us.size();
      std::printf("  %-44s %8zu %12lld %12lld %12lld\n", sig.c_str(), n, st.us[n / 2], st.us[std::min(n - 1, n * 99 / 100)],
                  st.us[n - 1]);
    }
  }
  return 0;
}

}  // namespace loom::info
