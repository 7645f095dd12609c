// Fuzz target `topology_xml`: a topology file a user hands to
// NCCL_TOPO_FILE -> xml::parse -> fromXml; then, for an accepted file, the
// schedules of 2 hosts x 3 ranks built from it.
//   - a refused file gives an error naming the origin and a line;
//   - an accepted file dumps to text that parses back to the same tree and
//     the same graph (load -> dump -> load keeps it);
//   - the schedules pass checkSchedule.
//
// Input: the file's bytes.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_input.h"
#include "topology/schedule.h"
#include "topology/topology.h"
#include "topology/xml.h"

namespace topo = loom::topology;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto root = topo::xml::parse(text, "fuzz.xml");
  if (!root.isOk()) {
    FUZZ_TRACE("parse: %s\n", root.status().message().c_str());
    FUZZ_CHECK(root.status().message().rfind("fuzz.xml:", 0) == 0);
    return 0;
  }
  const topo::xml::Element tree = root.value();
  auto t = topo::fromXml(std::move(root).value(), "fuzz.xml");
  if (!t.isOk()) {
    FUZZ_TRACE("build: %s\n", t.status().message().c_str());
    FUZZ_CHECK(t.status().message().rfind("fuzz.xml:", 0) == 0);
    return 0;
  }
  const std::string dumped = topo::xml::write(t->xml);
  auto again = topo::xml::parse(dumped, "dump");
  FUZZ_CHECK(again.isOk());
  FUZZ_CHECK(again.value() == tree);
  auto t2 = topo::fromXml(std::move(again).value(), "dump");
  FUZZ_CHECK(t2.isOk());
  FUZZ_CHECK(t2->nodes == t->nodes);
  FUZZ_CHECK(t2->links == t->links);
  (void)topo::describe(*t);
  (void)topo::topologyDot(*t);
  const topo::Layout layout = topo::spreadLayout({t.value(), t.value()}, 3);
  const topo::Schedule s = topo::buildSchedule(layout);
  FUZZ_CHECK(topo::checkSchedule(layout, s).isOk());
  return 0;
}
