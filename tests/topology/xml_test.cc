#include "topology/xml.h"

#include <gtest/gtest.h>

namespace loom::topology::xml {
namespace {

TEST(TopologyXml, ParsesElementsAttributesAndLines) {
  auto r = parse("<?xml version=\"1.0\"?>\n<!-- c -->\n<system version='1'>\n  <cpu numaid=\"0\">\n"
                 "    <pci busid=\"a&amp;b\"/>\n  </cpu>\n</system>\n",
                 "t.xml");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Element& s = r.value();
  EXPECT_EQ(s.name, "system");
  EXPECT_EQ(s.line, 3);
  ASSERT_EQ(s.children.size(), 1u);
  EXPECT_EQ(s.children[0].line, 4);
  EXPECT_EQ(*s.children[0].attr("numaid"), "0");
  EXPECT_EQ(*s.children[0].children[0].attr("busid"), "a&b");
  EXPECT_EQ(s.children[0].children[0].line, 5);
}

TEST(TopologyXml, WriteThenParseGivesTheSameTree) {
  Element root;
  root.name = "system";
  root.set("version", "1");
  Element& cpu = root.add("cpu");
  cpu.set("note", "quotes \" and <angles> & amps");
  cpu.add("pci").set("busid", "0000:01:00.0");
  auto back = parse(write(root), "mem");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back.value(), root);
}

// Each broken document gives an error with the origin, the line and a hint
// of what is wrong.
TEST(TopologyXml, BadDocumentsNameFileLineAndElement) {
  struct Case {
    const char* text;
    int line;
    const char* expect;
  } cases[] = {
      {"", 1, "no root element"},
      {"<system>\n<cpu>\n</system>", 3, "</system> closes <cpu>"},
      {"<system>\n  <cpu numaid=0/>\n</system>", 2, "without quotes"},
      {"<system>\n  <cpu numaid=\"0\" numaid=\"1\"/>\n</system>", 2, "twice"},
      {"<system>\n<cpu a=\"x", 2, "unterminated value"},
      {"<system>\n<!-- never closed\n", 2, "unterminated comment"},
      {"<system/>\n<extra/>", 2, "after the root"},
      {"<system a=\"&bogus;\"/>", 1, "unknown entity"},
      {"<system>\n\n<cpu", 3, "not closed"},
      {"text<system/>", 1, "text before"},
      {"<system a=\"1\"b=\"2\"/>", 1, "no space before"},
      {"<system a=\"&#0;\"/>", 1, "ASCII"},
  };
  for (const auto& c : cases) {
    auto r = parse(c.text, "bad.xml");
    ASSERT_FALSE(r.isOk()) << c.text;
    const std::string& m = r.status().message();
    EXPECT_NE(m.find("bad.xml:" + std::to_string(c.line) + ":"), std::string::npos) << c.text << " -> " << m;
    EXPECT_NE(m.find(c.expect), std::string::npos) << c.text << " -> " << m;
  }
}

TEST(TopologyXml, DeepNestingIsAnErrorNotACrash) {
  std::string text;
  for (int i = 0; i < 100000; ++i) text += "<a>";
  auto r = parse(text, "deep.xml");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("nested deeper"), std::string::npos) << r.status().message();
}

TEST(TopologyXml, ElementAndAttributeCountsAreBounded) {
  std::string many = "<system>";
  for (int i = 0; i <= kMaxElements; ++i) many += "<pci/>";
  many += "</system>";
  auto r = parse(many, "many.xml");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("more than 16384 elements"), std::string::npos) << r.status().message();
  std::string wide = "<system";
  for (int i = 0; i <= kMaxAttributes; ++i) wide += " a" + std::to_string(i) + "=\"1\"";
  wide += "/>";
  r = parse(wide, "wide.xml");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("more than 256 attributes"), std::string::npos) << r.status().message();
}

TEST(TopologyXml, MissingFileIsASystemError) {
  auto r = parseFile("/nonexistent/topo.xml");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("/nonexistent/topo.xml"), std::string::npos);
}

}  // namespace
}  // namespace loom::topology::xml
