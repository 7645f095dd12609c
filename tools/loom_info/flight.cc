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
  long long coll = 0;  // 0: point-to-point
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

}  // namespace loom::info
