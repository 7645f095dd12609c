#!/usr/bin/env bash
# loom-topo end to end: pictures rendered by graphviz, dumps that load
# again, bad files refused with their line. Usage: loom_topo_test.sh
# <loom-topo> <fixtures dir> <case>. Exit 77 (skipped, with the reason) when
# graphviz is missing.
set -uo pipefail
tool=$1 fixtures=$2 case=$3
work=$(mktemp -d /tmp/loom-topo-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

render() {  # dot file -> png, checked
  command -v dot >/dev/null || { echo "SKIPPED: graphviz's dot is not installed (apt-get install graphviz)"; exit 77; }
  dot -Tpng "$1" -o "$1.png" || fail "dot could not render $1"
  [ -s "$1.png" ] || fail "$1.png is empty"
  [ "$(head -c 4 "$1.png" | od -An -tx1 | tr -d ' \n')" = 89504e47 ] || fail "$1.png is not a PNG"
  echo "rendered $1.png ($(stat -c %s "$1.png") bytes)"
}

case $case in
  fixture_pictures)
    "$tool" --topo "$fixtures/dgx-h100-like.xml" --hosts 4 --ranks-per-host 8 \
      --dot "$work/machine.dot" --schedule-dot "$work/schedule.dot" > "$work/out" || fail "loom-topo failed: $(cat "$work/out")"
    grep -q "8 GPU(s), 9 NIC port(s)" "$work/out" || fail "no GPU/NIC summary"
    grep -q "^  Channel 07/08 :" "$work/out" || fail "expected 8 rings"
    grep -q "^check: ok" "$work/out" || fail "schedule check"
    grep -q "NVSwitch" "$work/machine.dot" || fail "no NVSwitch in the picture"
    render "$work/machine.dot"
    render "$work/schedule.dot"
    ;;
  this_machine)
    for method in auto sysfs; do
      "$tool" --method $method --dot "$work/here.dot" --dump "$work/here.xml" > "$work/out" || fail "loom-topo --method $method: $(cat "$work/out")"
      grep -q "^detected with \(hwloc\|sysfs\) on this machine" "$work/out" || fail "no detection line"
      [ $method = sysfs ] && { grep -q "^detected with sysfs" "$work/out" || fail "sysfs not used"; }
      grep -q "NUMA node(s)" "$work/out" || fail "no summary"
      # The dump loads again and describes the same machine.
      "$tool" --topo "$work/here.xml" > "$work/again" || fail "the dump does not load: $(cat "$work/again")"
      diff <(sed -n '2,/^$/p' "$work/out" | sed 's/^topology ([^)]*)//') \
           <(sed -n '1,/^$/p' "$work/again" | sed 's/^topology ([^)]*)//') || fail "dump -> load changed the machine"
      render "$work/here.dot"
    done
    ;;
  bad_files)
    printf '<system version="1">\n  <cpu numaid="0">\n    <pci busid="0000:01:00.0" class=0x030200/>\n  </cpu>\n</system>\n' > "$work/bad.xml"
    "$tool" --topo "$work/bad.xml" > "$work/out" 2>&1; rc=$?
    [ $rc = 2 ] || fail "exit status $rc for a bad file"
    grep -q "bad.xml:3: <pci> attribute 'class': value without quotes" "$work/out" || fail "message: $(cat "$work/out")"
    printf '<system>\n<cpu numaid="0">\n<nic><net dev="1"/></nic>\n</cpu>\n</system>\n' > "$work/bad2.xml"
    "$tool" --topo "$work/bad2.xml" > "$work/out" 2>&1; rc=$?
    [ $rc = 2 ] || fail "exit status $rc for a bad topology"
    grep -q "bad2.xml:3: <net dev=\"1\">: attribute 'name' is missing" "$work/out" || fail "message: $(cat "$work/out")"
    "$tool" --topo /nonexistent.xml > "$work/out" 2>&1; rc=$?
    [ $rc = 2 ] && grep -q "/nonexistent.xml" "$work/out" || fail "missing file: $rc $(cat "$work/out")"
    "$tool" --hosts zero > "$work/out" 2>&1; [ $? = 2 ] || fail "bad argument accepted"
    ;;
  *) fail "unknown case $case" ;;
esac
echo "ok: $case"
