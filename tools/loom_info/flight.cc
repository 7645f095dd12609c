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

namespace loom::info {
namespace {

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
  std::string kind, count, type, op, root, state;
  long long startUs = 0, endUs = 0;
  std::string signature() const {
    return kind + " " + count + " x " + type + (op.empty() ? "" : " " + op) + (root == "-1" ? "" : " root " + root);
  }
};

struct RankFile {
  std::string path, host, pid, reason;
  int rank = -1, nranks = 0;
  std::vector<Op> ops;
  long long lastDone() const {
    long long s = 0;
    for (const auto& o : ops)
      if (o.state == "done") s = std::max(s, o.seq);
    return s;
  }
  const Op* latest() const { return ops.empty() ? nullptr : &ops.back(); }
};

}  // namespace

int mergeFlight(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) {
    std::fprintf(stderr, "loom-info: cannot open %s\n", dir.c_str());
    return 2;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind("loom-flight-", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".json") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  std::map<std::string, std::map<int, RankFile>> comms;  // comm -> rank -> file
  int bad = 0;
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
        f.host = fields["host"];
        f.pid = fields["pid"];
        f.reason = fields["reason"];
        header = false;
        continue;
      }
      Op o;
      o.seq = std::atoll(fields["seq"].c_str());
      o.kind = fields["kind"];
      o.count = fields["count"];
      o.type = fields["type"];
      o.op = fields["op"];
      o.root = fields["root"];
      o.state = fields["state"];
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
    return 2;
  }
  std::printf("flight recorders in %s: %zu file(s), %zu communicator(s)\n", dir.c_str(), names.size() - size_t(bad),
              comms.size());
  for (const auto& [comm, ranks] : comms) {
    const int nranks = ranks.begin()->second.nranks;
    std::printf("\ncommunicator %s, %d rank(s)\n", comm.c_str(), nranks);
    std::printf("  %-5s %-16s %-8s %-22s %-28s %s\n", "rank", "host", "pid", "last done", "latest", "why the file");
    long long newest = 0;
    for (const auto& [r, f] : ranks) newest = std::max(newest, f.lastDone());
    std::vector<int> missing;
    for (int r = 0; r < nranks; ++r) {
      auto it = ranks.find(r);
      if (it == ranks.end()) {
        missing.push_back(r);
        std::printf("  %-5d %-16s %-8s %-22s %-28s %s\n", r, "-", "-", "-", "-", "(no file)");
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
    // Who is behind: a rank that has not called the newest operation the
    // others are in; where all called it, one that finished less.
    long long called = 0;
    for (const auto& [r, f] : ranks)
      if (f.latest()) called = std::max(called, f.latest()->seq);
    std::vector<std::string> behind;
    auto latestText = [](const RankFile& f) {
      const Op* l = f.latest();
      return l ? l->kind + " #" + std::to_string(l->seq) + " " + l->state : std::string("nothing");
    };
    for (const auto& [r, f] : ranks) {
      if ((f.latest() ? f.latest()->seq : 0) < called) {
        behind.push_back("rank " + std::to_string(r) + " (host " + f.host + ", pid " + f.pid + ") has not called #" +
                         std::to_string(called) + ": its latest is " + latestText(f));
      }
    }
    if (behind.empty()) {
      for (const auto& [r, f] : ranks) {
        if (f.lastDone() < newest) {
          behind.push_back("rank " + std::to_string(r) + " (host " + f.host + ", pid " + f.pid +
                           ") finished only up to #" + std::to_string(f.lastDone()) + ": its latest is " +
                           latestText(f));
        }
      }
    }
    if (!behind.empty()) {
      std::printf("  behind (the others reached #%lld, finished up to #%lld):\n", called, newest);
      for (const auto& b : behind) std::printf("    %s\n", b.c_str());
    } else {
      std::printf("  no rank is behind: all reached #%lld and finished up to #%lld\n", called, newest);
    }
    if (!missing.empty()) {
      std::string list;
      for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
      std::printf("  no file from rank(s) %s: dead, hung, or not told where to write (LOOM_FLIGHT_RECORDER_DIR)\n",
                  list.c_str());
    }
    // Different collectives at the same sequence number.
    std::map<long long, std::map<std::string, std::vector<int>>> bySeq;
    for (const auto& [r, f] : ranks)
      for (const auto& o : f.ops) bySeq[o.seq][o.signature()].push_back(r);
    int mismatches = 0;
    for (const auto& [seq, sigs] : bySeq) {
      if (sigs.size() < 2) continue;
      ++mismatches;
      std::printf("  MISMATCH at #%lld:", seq);
      for (const auto& [sig, rs] : sigs) {
        std::string list;
        for (int r : rs) list += (list.empty() ? "" : ",") + std::to_string(r);
        std::printf(" [rank %s: %s]", list.c_str(), sig.c_str());
      }
      std::printf("\n");
    }
    if (mismatches == 0) std::printf("  every rank called the same operations at the same sequence numbers\n");
  }
  return 0;
}

}  // namespace loom::info
