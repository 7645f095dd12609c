#include "tools/perf/options.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string_view>

#include "tools/perf/format.h"

namespace loom::perf {
namespace {

Result<long> parseInteger(std::string_view flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 0);
  if (text.empty() || *end != '\0' || errno == ERANGE) {
    return invalidArgument("option " + std::string(flag) + " expects an integer, got '" + text + "'");
  }
  return value;
}

Result<int> parseInt(std::string_view flag, const std::string& text, long low, long high) {
  LOOM_ASSIGN_OR_RETURN(long value, parseInteger(flag, text));
  if (value < low || value > high) {
    return invalidArgument("option " + std::string(flag) + " must be between " + std::to_string(low) + " and " +
                           std::to_string(high) + ", got " + text);
  }
  return int(value);
}

Result<uint64_t> parseBytes(std::string_view flag, const char* what, const std::string& text) {
  std::optional<uint64_t> bytes = parseSize(text);
  if (!bytes) {
    return invalidArgument("invalid size specified for '" + std::string(what) + "' (" + std::string(flag) + " " +
                           text + "); use a number with an optional K, M or G suffix (binary units)");
  }
  return *bytes;
}

using Handler = std::function<Status(Options&, const std::string&)>;

struct Flag {
  char shortName;
  const char* longName;
  Handler handler;
};

Status setOp(Options& o, const std::string& v) {
  if (v == "all") {
    o.op.reset();
    return Status::ok();
  }
  std::optional<Op> op = parseOpName(v);
  if (!op) return invalidArgument("invalid op '" + v + "'; use sum, prod, max, min, avg, mulsum or all");
  o.op = *op;
  return Status::ok();
}

Status setType(Options& o, const std::string& v) {
  if (v == "all") {
    o.type.reset();
    return Status::ok();
  }
  std::optional<ncclDataType_t> type = parseTypeName(v);
  if (!type) {
    return invalidArgument("invalid type '" + v +
                           "'; use int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, "
                           "f8e4m3, f8e5m2 or all");
  }
  o.type = *type;
  return Status::ok();
}

Status setRoot(Options& o, const std::string& v) {
  if (v == "all") {  // nccl-tests would read this as 0; every root is what it asks for
    o.root = -1;
    return Status::ok();
  }
  LOOM_ASSIGN_OR_RETURN(o.root, parseInt("-r", v, -1, 1 << 30));
  return Status::ok();
}

// Flags that only make sense on a GPU or for features loom's tools leave out.
Status noteGraph(Options& o, const std::string& v) {
  LOOM_ASSIGN_OR_RETURN(int launches, parseInt("-G", v, 0, 1 << 30));
  if (launches > 0) {
    o.ignoredNotes.push_back("-G " + v + ": loom's perf tools do not capture CUDA graphs; ops are launched directly");
  }
  return Status::ok();
}

Status noteDevice(Options& o, const std::string& v) {
  LOOM_ASSIGN_OR_RETURN(int impl, parseInt("-D", v, 0, 1 << 30));
  if (impl > 0) {
    return invalidUsage("-D " + v +
                        ": loom's perf tools have no device-API kernels; run without -D to test the "
                        "library's collectives");
  }
  return Status::ok();
}

std::vector<Flag> flagTable() {
  auto intFlag = [](int Options::*field, const char* name, long low, long high) {
    return [=](Options& o, const std::string& v) -> Status {
      LOOM_ASSIGN_OR_RETURN(o.*field, parseInt(name, v, low, high));
      return Status::ok();
    };
  };
  auto boolFlag = [](bool Options::*field, const char* name) {
    return [=](Options& o, const std::string& v) -> Status {
      LOOM_ASSIGN_OR_RETURN(long value, parseInteger(name, v));
      o.*field = value != 0;
      return Status::ok();
    };
  };
  auto bytesFlag = [](uint64_t Options::*field, const char* name, const char* what) {
    return [=](Options& o, const std::string& v) -> Status {
      LOOM_ASSIGN_OR_RETURN(o.*field, parseBytes(name, what, v));
      return Status::ok();
    };
  };
  auto note = [](const char* name, const char* why) {
    return [=](Options& o, const std::string& v) -> Status {
      LOOM_ASSIGN_OR_RETURN(long value, parseInteger(name, v));
      if (value != 0) o.ignoredNotes.push_back(std::string(name) + " " + v + ": " + why);
      return Status::ok();
    };
  };
  constexpr long kMaxInt = 1 << 30;
  return {
      {'t', "nthreads", intFlag(&Options::nThreads, "-t", 1, 1024)},
      {'g', "ngpus", intFlag(&Options::nGpus, "-g", 1, 1024)},
      {'b', "minbytes", bytesFlag(&Options::minBytes, "-b", "minbytes")},
      {'e', "maxbytes", bytesFlag(&Options::maxBytes, "-e", "maxbytes")},
      {'i', "stepbytes", bytesFlag(&Options::stepBytes, "-i", "stepBytes")},
      {'f', "stepfactor",
       [](Options& o, const std::string& v) -> Status {
         LOOM_ASSIGN_OR_RETURN(long factor, parseInteger("-f", v));
         o.stepFactor = factor > 1 ? uint64_t(factor) : 1;
         return Status::ok();
       }},
      {'n', "iters", intFlag(&Options::iters, "-n", 1, kMaxInt)},
      {'w', "warmup_iters", intFlag(&Options::warmupIters, "-w", 0, kMaxInt)},
      {'m', "agg_iters", intFlag(&Options::aggIters, "-m", 1, kMaxInt)},
      {'N', "run_cycles", intFlag(&Options::runCycles, "-N", 0, kMaxInt)},
      {'p', "parallel_init", boolFlag(&Options::parallelInit, "-p")},
      {'c', "check", intFlag(&Options::check, "-c", 0, kMaxInt)},
      {'o', "op", setOp},
      {'d', "datatype", setType},
      {'r', "root", setRoot},
      {'z', "blocking", intFlag(&Options::blocking, "-z", 0, 3)},
      {'y', "stream_null", boolFlag(&Options::streamNull, "-y")},
      {'T', "timeout", intFlag(&Options::timeoutSeconds, "-T", 0, kMaxInt)},
      {'G', "cudagraph", noteGraph},
      {'C', "report_cputime", boolFlag(&Options::reportCputime, "-C")},
      {'S', "report_timestamps", boolFlag(&Options::reportTimestamps, "-S")},
      {'J', "output_file",
       [](Options& o, const std::string& v) -> Status {
         o.ignoredNotes.push_back("-J " + v + ": loom's perf tools write no JSON file; parse the table instead");
         return Status::ok();
       }},
      {'a', "average", intFlag(&Options::average, "-a", 0, 3)},
      {'R', "local_register", intFlag(&Options::localRegister, "-R", 0, 2)},
      {'x', "cta_policy", intFlag(&Options::ctaPolicy, "-x", 0, 2)},
      {'D', "device_implementation", noteDevice},
      {'V', "device_cta_count", note("-V", "only used with -D, which loom's perf tools do not support")},
      {'M', "memory", intFlag(&Options::memoryReport, "-M", 0, 1)},
      {'u', "unalign", intFlag(&Options::unalign, "-u", 0, kMaxInt)},
      {'I', "per_iter_timing", note("-I", "per-iteration timing is not reported by loom's perf tools")},
      {'K', "per_iter_skip", note("-K", "only used with -I, which loom's perf tools do not report")},
      {'\0', "time_decimals", intFlag(&Options::timeDecimals, "--time_decimals", 0, 4)},
  };
}

Status validate(const Options& o) {
  if (o.minBytes > o.maxBytes) {
    return invalidArgument("invalid sizes for 'minbytes' and 'maxbytes': " + std::to_string(o.minBytes) + " > " +
                           std::to_string(o.maxBytes));
  }
  if (o.minBytes < o.maxBytes && o.stepFactor > 1 && o.minBytes == 0) {
    return invalidArgument("-b 0 with -f " + std::to_string(o.stepFactor) +
                           " never grows; start at a size above 0 or use -i");
  }
  if (o.minBytes < o.maxBytes && o.stepFactor <= 1 && o.stepBytes == 0) {
    return invalidArgument("-i 0 never grows the size; give a step above 0 or use -f");
  }
  return Status::ok();
}

}  // namespace

Result<Options> parseOptions(int argc, const char* const* argv) {
  Options options;
  std::vector<Flag> flags = flagTable();
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      options.help = true;
      continue;
    }
    const Flag* flag = nullptr;
    std::optional<std::string> value;
    if (arg.rfind("--", 0) == 0 && arg.size() > 2) {
      std::string name = arg.substr(2);
      size_t eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name.resize(eq);
      }
      for (const Flag& f : flags) {
        if (name == f.longName) flag = &f;
      }
    } else if (arg.size() >= 2 && arg[0] == '-') {
      for (const Flag& f : flags) {
        if (arg[1] == f.shortName) flag = &f;
      }
      if (arg.size() > 2) value = arg.substr(2);
    }
    if (flag == nullptr) return invalidArgument("invalid option '" + arg + "'; run with -h for the list");
    if (!value) {
      if (i + 1 >= argc) return invalidArgument("option '" + arg + "' needs a value");
      value = argv[++i];
    }
    LOOM_TRY(flag->handler(options, *value));
  }
  LOOM_TRY(validate(options));
  return options;
}

std::string usageText(const char* programName) {
  std::string text = "USAGE: ";
  text += programName;
  text += R"( 
	[-t,--nthreads <num threads>] 
	[-g,--ngpus <gpus per thread>]  (ranks per thread; in host mode each is a CPU rank)
	[-b,--minbytes <min size in bytes>] 
	[-e,--maxbytes <max size in bytes>] 
	[-i,--stepbytes <increment size>] 
	[-f,--stepfactor <increment factor>] 
	[-n,--iters <iteration count>] 
	[-m,--agg_iters <aggregated iteration count>] 
	[-w,--warmup_iters <warmup iteration count>] 
	[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)] 
	[-p,--parallel_init <0/1>] 
	[-c,--check <check iteration count>] 
	[-o,--op <sum/prod/min/max/avg/mulsum/all>] 
	[-d,--datatype <nccltype/all>] 
	[-r,--root <root>]  (-1 or all: every root)
	[-z,--blocking <0/1/2/3> 1=barrier after each inner iter (-m), 2=no barrier, 3=wait and barrier after each outer iter (-n)] 
	[-y,--stream_null <0/1>]  (CUDA buffers only; ignored in host mode)
	[-T,--timeout <time in seconds>]  (then ncclCommAbort on every communicator and fail)
	[-G,--cudagraph <num graph launches>]  (accepted and ignored: loom's tools launch ops directly)
	[-C,--report_cputime <0/1>] 
	[-S,--report_timestamps <0/1> report timestamps (default 0)] 
	[-J,--output_file <file>]  (accepted and ignored: no JSON output; parse the table)
	[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>] 
	[-R,--local_register <0/1/2> ncclCommRegister (1) or ncclCommWindowRegister (2) on the test buffers (default: 0)] 
	[-x,--cta_policy <0/1/2> sets ncclConfig_t.CTAPolicy (default: do not set)] 
	[-D,--device_implementation <0>]  (only 0: loom's tools have no device-API kernels)
	[-V,--device_cta_count <number>]  (accepted and ignored; only used with -D)
	[-M,--memory <0/1> GPU memory usage report (CUDA buffers only)] 
	[-u,--unalign <index of first element> Misalign source and destination buffers (default: 0)] 
	[-I,--per_iter_timing <0/1>]  (accepted and ignored)
	[-K,--per_iter_skip <count>]  (accepted and ignored)
	[--time_decimals <0-4>]  (loom's own: decimals of the time columns, default 2 as in
	                          nccl-tests; fewer where a number would not fit its column)
	[-h,--help]

Ranks: processes x -t x -g. Process rank and count come from LOOM_RANK/LOOM_WORLD_SIZE,
OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, RANK/WORLD_SIZE or SLURM_PROCID/NTASKS (first found);
with more than one process, NCCL_COMM_ID=host:port names the rendezvous (loomrun sets both).
Buffers: CUDA device memory when a GPU is usable and LOOM_DEVICE is not "host", else host memory.
)";
  return text;
}

}  // namespace loom::perf
