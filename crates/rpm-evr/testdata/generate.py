#!/usr/bin/env python3
"""Regenerates the comparison tables in this directory by asking a real rpm (4.15 or later).

Usage: python3 testdata/generate.py   (from crates/rpm-evr, with `rpm` on PATH)

Each output line is `a<TAB>b<TAB>expected`, expected being -1, 0 or 1 as rpm answered:
  vercmp.tsv  bare strings through rpm.vercmp() (no ':' or '-' in them, so this is rpmvercmp)
  evr.tsv     [epoch:]version[-release] strings through rpm.ver() comparison (rpmverCmp)
The inputs are rpm's own test-suite cases, hand-picked edge cases and seeded random ones.
"""
import os
import random
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# Cases from rpm's test suite (tests/rpmvercmp.at), including the ones it documents as oddities.
RPM_SUITE = """
1.0 1.0|1.0 2.0|2.0.1 2.0.1|2.0 2.0.1|2.0.1a 2.0.1a|2.0.1a 2.0.1|5.5p1 5.5p1|5.5p1 5.5p2
5.5p10 5.5p10|5.5p1 5.5p10|10xyz 10.1xyz|xyz10 xyz10|xyz10 xyz10.1|xyz.4 xyz.4|xyz.4 8|xyz.4 2
5.5p2 5.6p1|5.6p1 6.5p1|6.0.rc1 6.0|10b2 10a1|10a2 10b2|1.0aa 1.0aa|1.0a 1.0aa|10.0001 10.0001
10.0001 10.1|10.0001 10.0039|4.999.9 5.0|20101121 20101121|20101121 20101122|2_0 2_0|2.0 2_0
a a|a+ a+|a+ a_|+a +a|+a _a|+_ +_|_+ +_|_+ _+|+ _
1.0~rc1 1.0~rc1|1.0~rc1 1.0|1.0~rc1 1.0~rc2|1.0~rc1~git123 1.0~rc1~git123|1.0~rc1~git123 1.0~rc1
1.0^ 1.0^|1.0^ 1.0|1.0^git1 1.0^git1|1.0^git1 1.0|1.0^git1 1.0^git2|1.0^git1 1.01
1.0^20160101 1.0^20160101|1.0^20160101 1.0.1|1.0^20160101^git1 1.0^20160101^git1
1.0^20160102 1.0^20160101^git1|1.0~rc1^git1 1.0~rc1^git1|1.0~rc1^git1 1.0~rc1
1.0^git1~pre 1.0^git1~pre|1.0^git1 1.0^git1~pre
1b.fc17 1b.fc17|1b.fc17 1.fc17|1g.fc17 1g.fc17|1g.fc17 1.fc17
1.1.α 1.1.α|1.1.α 1.1.β|1.1.αα 1.1.α|1.1.α 1.1.ββ|1.1.ββ 1.1.αα
"""

# Edge cases of our own: empty strings, only separators, huge numbers, mixed case, tilde/caret
# against end and each other, trailing separators.
EDGE = """
 |1 |~ |^ |. |1 1.|1. 1.0|1.0. 1.0|1.0.. 1.0|..1 1|~ ^|~~ ~|^^ ^|~^ ^~|1~ 1^|1^ 1a|1^ 1.0
1^~ 1^|1~^ 1~|1.0^ 1.0a|1.0^1 1.0a|1.0~ 1.0|1.0~ 1.0~~|1.0 1.0~~|a A|Z a|abc abd|ab a.b
0 00|0 000000000000000000000|1 0001|099999999999999999999999999999 1000000000000000000000000000000
18446744073709551616 18446744073709551615|123456789012345678901234567890 123456789012345678901234567891
1a 1.a|1a1 1.a.1|a1 a.1|1_a 1a|1.a 1A|1.0 1.0.0|1.0.0 1.0|1.00 1.0|1.010 1.10|1.01 1.1
a1b2 a1b2c|%{x}1 1|1{2} 1.2|1+2 1_2|git gi|rc1 rc01|rc10 rc9|pre1 rc1|alpha beta|1.0-1 1.0_1
"""

ALPHABETS = ["0", "1", "2", "9", "00", "01", "10", "a", "b", "z", "A", "rc", "git", "p", ".", "_", "+", "~", "^"]
EVR_PIECES = ["0", "1", "2", "9", "00", "01", "10", "123", "a", "b", "z", "A", "rc", "el", "fc", "git", "p", ".", "_", "+", "~", "^", "%", "{", "}"]


def random_piece(rng, pieces, lo, hi):
    return "".join(rng.choice(pieces) for _ in range(rng.randint(lo, hi)))


def mutate(rng, s, pieces):
    """A near miss of s, so that pairs exercise the interesting tie-breaks."""
    if not s:
        return rng.choice(pieces)
    i = rng.randrange(len(s) + 1)
    op = rng.randrange(5)
    if op == 0:
        return s[:i] + rng.choice(pieces) + s[i:]
    if op == 1:
        return s[:i] + s[i + 1:]
    if op == 2:
        return s[:i] + rng.choice(pieces) + s[i + 1:]
    if op == 3:
        return s + rng.choice(["~", "^", ".", "a", "1", "0", "~rc1", "^git1", ".0"])
    return s.replace(".", rng.choice(["_", "+", ".", "..", ""]), 1)


def valid_field(s):
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+%{}~^")
    return s != "" and ".." not in s and set(s) <= allowed


def random_evr(rng):
    while True:
        epoch = rng.choice(["", "", "", "0:", "1:", "2:", "01:", "10:", ":"])
        version = random_piece(rng, EVR_PIECES, 1, 6)
        release = rng.choice([None, None, random_piece(rng, EVR_PIECES, 1, 4), "1", "1.el9", "2.fc40"])
        if valid_field(version) and (release is None or valid_field(release)):
            return epoch + version + ("" if release is None else "-" + release)


def mutate_evr(rng, s):
    for _ in range(20):
        if rng.random() < 0.5:
            t = random_evr(rng)
        else:
            head, sep, tail = s.rpartition("-")
            if sep and rng.random() < 0.5:
                t = head + "-" + mutate(rng, tail, EVR_PIECES)
            elif rng.random() < 0.3:
                t = rng.choice(["", "0:", "1:", "00:"]) + s.split(":", 1)[-1]
            else:
                t = mutate(rng, s, EVR_PIECES)
        if parses(t):
            return t
    return s


def parses(s):
    if s == "" or s.count(":") > 1 or s.count("-") > 1:
        return False
    epoch, sep, vr = s.rpartition(":")
    if sep and (not epoch.isdigit() and epoch != "" or (epoch and int(epoch) > 2**32 - 1)):
        return False
    version, sep, release = vr.partition("-")
    return valid_field(version) and (not sep or valid_field(release))


def vercmp_pairs():
    pairs = []
    for block in (RPM_SUITE, EDGE):
        for item in block.replace("\n", "|").split("|"):
            if item.strip() == "" and item == "":
                continue
            a, _, b = item.partition(" ")
            pairs += [(a, b), (b, a)]
    rng = random.Random(4150)
    for _ in range(3000):
        a = random_piece(rng, ALPHABETS, 0, 7)
        b = mutate(rng, a, ALPHABETS) if rng.random() < 0.7 else random_piece(rng, ALPHABETS, 0, 7)
        pairs.append((a, b))
    # rpm.vercmp() parses its arguments as EVRs, which equals a bare rpmvercmp only for non-empty
    # strings without ':' and '-'; those are tested directly in the Rust tests instead.
    bare = lambda s: s != "" and ":" not in s and "-" not in s
    return dedup([(a, b) for a, b in pairs if bare(a) and bare(b)])


def evr_pairs():
    fixed = [
        ("1.0", "1.0-1"), ("1.0-1", "1.0"), ("0:1.0", "1.0"), (":1.0", "1.0"), ("1:1.0", "2.0"),
        ("1.0-.", "1.0"), ("1.0-_", "1.0-+"), ("1:1.0-1", "01:1.0-1"), ("4294967295:1", "4294967294:9"),
        ("1.0-1~rc", "1.0-1"), ("1.0-1^p", "1.0-1"), ("1.0~rc1-5", "1.0-1"), ("1.0-1.el8", "1.0-1.el9"),
        ("5.14.0-362.24.1.el9_3", "5.14.0-362.18.1.el9_3"), ("1:1.1.1k-12.el8_9", "1:1.1.1k-9.el8_7"),
        ("2.0^20240101git1a2b3c-1.fc40", "2.0-1.fc40"), ("1.00-1", "1.0-1"), ("1.0-01", "1.0-1"),
        ("0.27.0", "0.27.0-1"), ("%{v}", "%{w}"), ("1{2}", "1.2"),
    ]
    pairs = fixed + [(b, a) for a, b in fixed]
    rng = random.Random(418)
    for _ in range(3000):
        a = random_evr(rng)
        b = mutate_evr(rng, a)
        pairs.append((a, b))
    assert all(parses(a) and parses(b) for a, b in pairs), [p for p in pairs if not (parses(p[0]) and parses(p[1]))]
    return dedup(pairs)


def dedup(pairs):
    seen, out = set(), []
    for p in pairs:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


LUA = r"""
local function run(infile, outfile, cmp)
  local out = io.open(outfile, "w")
  for line in io.lines(infile) do
    local a, b = line:match("^([^\t]*)\t([^\t]*)$")
    out:write(a, "\t", b, "\t", tostring(cmp(a, b)), "\n")
  end
  out:close()
end
local function evrcmp(a, b)
  local x, y = rpm.ver(a), rpm.ver(b)
  if x < y then return -1 elseif x == y then return 0 else return 1 end
end
run(DIR .. "/vercmp.in", DIR .. "/vercmp.out", rpm.vercmp)
run(DIR .. "/evr.in", DIR .. "/evr.out", evrcmp)
"""


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tables = {"vercmp": vercmp_pairs(), "evr": evr_pairs()}
        for name, pairs in tables.items():
            with open(os.path.join(tmp, name + ".in"), "w", encoding="utf-8") as f:
                for a, b in pairs:
                    f.write(f"{a}\t{b}\n")
        script = os.path.join(tmp, "run.lua")
        with open(script, "w") as f:
            f.write(f"local DIR = {tmp!r}\n" + LUA)
        version = subprocess.run(["rpm", "--version"], check=True, capture_output=True, text=True).stdout.strip()
        r = subprocess.run(["rpm", "--eval", "%{lua: dofile('" + script + "')}"], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("rpm failed: " + r.stderr)
        for name in tables:
            with open(os.path.join(tmp, name + ".out"), encoding="utf-8") as f:
                body = f.read()
            with open(os.path.join(HERE, name + ".tsv"), "w", encoding="utf-8") as f:
                f.write(f"# a<TAB>b<TAB>expected, as answered by {version}; regenerate with testdata/generate.py\n")
                f.write(body)
            print(name, body.count("\n"), "cases")


if __name__ == "__main__":
    main()
