// Output format of the perf tools against a hand-written sample of
// nccl-tests 2.19.6 output, number fitting, size parsing and options.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tools/perf/format.h"
#include "tools/perf/options.h"

namespace loom::perf {
namespace {

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> sampleLines() {
  std::ifstream in(LOOM_PERF_SAMPLE_FILE);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return splitLines(buffer.str());
}

TEST(PerfFormat, FitNumberFollowsNcclTestsWidths) {
  EXPECT_EQ(fitNumber(1234.56, 7), "1234.56");
  EXPECT_EQ(fitNumber(3.14159, 7), "   3.14");
  EXPECT_EQ(fitNumber(12345.678, 7), "12345.7");
  EXPECT_EQ(fitNumber(1234567.8, 7), "1234568");
  EXPECT_EQ(fitNumber(12345678.9, 7), "1.2e+07");
  EXPECT_EQ(fitNumber(108.72, 6), "108.72");
  EXPECT_EQ(fitNumber(1000.54, 6), "1000.5");
  EXPECT_EQ(fitNumber(123456.7, 6), "123457");
  EXPECT_EQ(fitNumber(1234567.0, 6), " 1e+06");
  EXPECT_EQ(fitNumber(0.0, 6), "  0.00");
  EXPECT_EQ(fitNumber(0.004, 6), "  0.00");
  EXPECT_EQ(fitNumber(1.0 / 0.0, 6), "   inf");
  // More decimals where asked (--time_decimals), fewer where they do not fit.
  EXPECT_EQ(fitNumber(0.08125, 7, 4), " 0.0813");
  EXPECT_EQ(fitNumber(123.456789, 7, 4), "123.457");
  EXPECT_EQ(fitNumber(123456.7, 7, 4), " 123457");
}


TEST(PerfFormat, ParseSizeUsesBinarySuffixes) {
  EXPECT_EQ(parseSize("8"), 8u);
  EXPECT_EQ(parseSize("1K"), 1024u);
  EXPECT_EQ(parseSize("1k"), 1024u);
  EXPECT_EQ(parseSize("32M"), 32u << 20);
  EXPECT_EQ(parseSize("0.5G"), 512u << 20);
  EXPECT_EQ(parseSize("2GB"), 2ull << 30);
  EXPECT_EQ(parseSize("4KiB"), 4096u);
  EXPECT_EQ(parseSize("1 K"), 1024u);
  EXPECT_EQ(parseSize("1.5"), 1u);
  EXPECT_FALSE(parseSize(""));
  EXPECT_FALSE(parseSize("abc"));
  EXPECT_FALSE(parseSize("-1"));
  EXPECT_FALSE(parseSize("1X"));
  EXPECT_FALSE(parseSize("1KX"));
  EXPECT_FALSE(parseSize("nan"));
}

TEST(PerfFormat, MatchesStoredNcclTestsSample) {
  std::vector<std::string> sample = sampleLines();
  ASSERT_EQ(sample.size(), 18u) << "tests/tools/nccl_tests_sample.txt was not read";

  RunDescription run{};
  run.programName = "all_reduce_perf";
  run.toolsVersion = "0.1.0";
  run.headerVersion = 22809;
  run.libraryVersion = 22809;
  run.nThreads = 1;
  run.nGpus = 1;
  run.minBytes = 8;
  run.maxBytes = 134217728;
  run.stepBytes = 1 << 20;
  run.stepFactor = 2;
  run.warmupIters = 1;
  run.iters = 20;
  run.aggIters = 1;
  run.check = 1;
  std::string out = runHeader(run);
  out += "# Using devices\n";
  out += deviceLine(0, 0, 12345, "node01", 0, "0000:1b:00", "NVIDIA H200");
  out += tableHeader(false, false);
  out += rowPrefix(134217728, 33554432, "float", "sum", -1) + rowBody(1234.56, 108.72, 190.26, true, 0) +
         rowBody(1230.01, 109.12, 190.96, true, 0) + "\n";
  out += rowPrefix(1024, 256, "float", "none", 3) + rowBody(12.34, 0.08, 0.08, false, 0) +
         rowBody(11.0, 0.09, 0.09, false, 0) + "\n";
  out += rowPrefix(8, 2, "double", "avg", -1) + rowBody(12345.678, 1000.54, 123456.7, true, 17) +
         rowBody(1234567.8, 12345678.0, 1234567.0, true, 0) + "\n";
  out += resultFooter(0, 95.1234, -1, "all_reduce_perf");
  out += "#\n";
  std::vector<std::string> ours = splitLines(out);
  ASSERT_EQ(ours.size(), sample.size());

  // Line 1 differs on purpose: we do not claim to be nccl-tests.
  EXPECT_TRUE(std::regex_match(ours[0], std::regex(R"(# loom-tests version \S+ \(nccl-tests 2\.19\.6 compatible\) )"
                                                   R"(nccl-headers=22809 nccl-library=22809)")))
      << ours[0];
  for (size_t i = 1; i < sample.size(); ++i) EXPECT_EQ(ours[i], sample[i]) << "line " << i + 1;
}

TEST(PerfFormat, TimestampsAndCputimeChangeTheHeader) {
  std::vector<std::string> lines = splitLines(tableHeader(true, true));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_NE(lines[2].find("cputime"), std::string::npos);
  EXPECT_NE(lines[2].find("timestamp"), std::string::npos);
  EXPECT_NE(lines[3].find("%Y-%m-%d %H:%M:%S"), std::string::npos);
  EXPECT_EQ(rowTimestamp().size(), 21u);
}

TEST(PerfFormat, FooterReportsFailures) {
  std::vector<std::string> lines = splitLines(resultFooter(3, 1.5, 10.0, "x_perf"));
  EXPECT_EQ(lines[0], "# Out of bounds values : 3 FAILED");
  EXPECT_EQ(lines[1], "# Avg bus bandwidth    : 1.5 FAILED");
  lines = splitLines(resultFooter(0, 9.5, 10.0, "x_perf"));
  EXPECT_EQ(lines[1], "# Avg bus bandwidth    : 9.5 OK");
}

Result<Options> parse(std::vector<const char*> args) {
  args.insert(args.begin(), "all_reduce_perf");
  return parseOptions(int(args.size()), args.data());
}

TEST(PerfOptions, DefaultsMatchNcclTests) {
  Result<Options> options = parse({});
  ASSERT_TRUE(options.isOk()) << options.status().toString();
  EXPECT_EQ(options->minBytes, 32u << 20);
  EXPECT_EQ(options->maxBytes, 32u << 20);
  EXPECT_EQ(options->stepBytes, 1u << 20);
  EXPECT_EQ(options->iters, 20);
  EXPECT_EQ(options->warmupIters, 1);
  EXPECT_EQ(options->check, 1);
  EXPECT_EQ(options->average, 1);
  EXPECT_EQ(options->op, Op::kSum);
  EXPECT_EQ(options->type, ncclFloat32);
}

TEST(PerfOptions, ShortLongAndAttachedForms) {
  Result<Options> options = parse({"-b", "8", "--maxbytes", "1G", "-f2", "--op=all", "-d", "bfloat16", "-t", "3",
                                   "-g", "2", "-r", "-1", "-a", "3", "-c", "0", "-z", "1"});
  ASSERT_TRUE(options.isOk()) << options.status().toString();
  EXPECT_EQ(options->minBytes, 8u);
  EXPECT_EQ(options->maxBytes, 1ull << 30);
  EXPECT_EQ(options->stepFactor, 2u);
  EXPECT_FALSE(options->op.has_value());
  EXPECT_EQ(options->type, ncclBfloat16);
  EXPECT_EQ(options->nThreads, 3);
  EXPECT_EQ(options->nGpus, 2);
  EXPECT_EQ(options->root, -1);
  EXPECT_EQ(options->average, 3);
  EXPECT_EQ(options->check, 0);
  EXPECT_EQ(options->blocking, 1);
}

TEST(PerfOptions, TypeAliasesAndAll) {
  EXPECT_EQ(parse({"-d", "fp16"})->type, ncclFloat16);
  EXPECT_EQ(parse({"-d", "int"})->type, ncclInt32);
  EXPECT_EQ(parse({"-d", "char"})->type, ncclInt8);
  EXPECT_EQ(parse({"-d", "f8e5m2"})->type, ncclFloat8e5m2);
  EXPECT_FALSE(parse({"-d", "all"})->type.has_value());
  EXPECT_EQ(parse({"-o", "mulsum"})->op, Op::kMulSum);
}

TEST(PerfOptions, RejectsBadValuesWithAMessage) {
  Result<Options> bad = parse({"-d", "float128"});
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("float128"), std::string::npos);
  EXPECT_FALSE(parse({"-o", "xor"}).isOk());
  EXPECT_FALSE(parse({"-b", "1X"}).isOk());
  EXPECT_FALSE(parse({"-b", "2M", "-e", "1M"}).isOk());
  EXPECT_FALSE(parse({"-t", "0"}).isOk());
  EXPECT_FALSE(parse({"-n"}).isOk());
  EXPECT_FALSE(parse({"--nosuchflag", "1"}).isOk());
  EXPECT_FALSE(parse({"-D", "1"}).isOk());
}

// loom's own --time_decimals (no short form) sets the time columns'
// decimals; the default stays nccl-tests' 2.
TEST(PerfOptions, TimeDecimals) {
  EXPECT_EQ(parse({})->timeDecimals, 2);
  EXPECT_EQ(parse({"--time_decimals", "4"})->timeDecimals, 4);
  EXPECT_EQ(parse({"--time_decimals=0"})->timeDecimals, 0);
  EXPECT_FALSE(parse({"--time_decimals", "5"}).isOk());
  EXPECT_FALSE(parse({"--time_decimals", "-1"}).isOk());
  EXPECT_NE(rowBody(0.08125, 0.1, 0.1, false, 0, 4).find(" 0.0813"), std::string::npos);
}

TEST(PerfOptions, GpuOnlyFlagsAreAcceptedWithNotes) {
  Result<Options> options = parse({"-G", "5", "-J", "out.json", "-I", "1", "-V", "8", "-y", "1", "-x", "1", "-R", "1",
                                   "-M", "1", "-D", "0"});
  ASSERT_TRUE(options.isOk()) << options.status().toString();
  EXPECT_EQ(options->ignoredNotes.size(), 4u);
  EXPECT_TRUE(options->streamNull);
  EXPECT_EQ(options->ctaPolicy, 1);
  EXPECT_EQ(options->localRegister, 1);
  EXPECT_TRUE(parse({"-h"})->help);
  EXPECT_NE(usageText("x_perf").find("--minbytes"), std::string::npos);
}

}  // namespace
}  // namespace loom::perf
