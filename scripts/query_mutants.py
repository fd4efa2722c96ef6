#!/usr/bin/env python3
"""Mutation testing for the SQL and Lua that cargo-mutants does not touch.

Each mutant changes one statement or script one small way: a comparison flipped, a
condition dropped or forced, AND and OR swapped, a NOT removed, a write removed (a SET
column keeps its old value, a call statement is left out). The backend's own tests run
against each mutant, which is then:

  caught    a test failed;
  unviable  a test failed because the server could not compile the mutant (a syntax
            error): it says nothing of the tests, and is counted apart;
  missed    every test passed: a behaviour nothing checks (or an equivalent mutant);
  timeout   the tests ran past the limit.

    scripts/query_mutants.py TARGET... [--list] [--shard K/N] [--files GLOB,...]
                             [--lines NAME:FIRST[-LAST],...] [--iterate]

Each mutant meets the backend's tests in three disjoint stages (the conformance suite,
the rest but the explorer's sampled run, then that run, which takes most of the time),
each only if the stages before it missed the mutant: a missed mutant has met the whole
suite. With --iterate, mutants an earlier run caught or found unviable (the lists
in the report directory) are skipped and the new outcomes are added to the lists, so a
long run can be made in parts.

Targets: postgres (idem-postgres/sql), redis (idem-redis/lua), sqlite (idem-sqlite/sql).
The server backends need their services (scripts/services.sh start postgres redis
redis-cluster). Reports go to target/query-mutants/TARGET/ (caught.txt, missed.txt,
unviable.txt, timeout.txt, each written as the run goes, and a summary in outcomes.txt).
Exits 1 when a mutant is missed or times out. Every file is restored after each mutant,
and on an interrupt.
"""

import argparse
import fnmatch
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# target: (directory, file suffix, comment prefix, the test command)
TARGETS = {
    "postgres": ("idem-postgres/sql", ".sql", "--", ["cargo", "nextest", "run", "-p", "idem-postgres"]),
    "redis": ("idem-redis/lua", ".lua", "--", ["cargo", "nextest", "run", "-p", "idem-redis"]),
    "sqlite": ("idem-sqlite/sql", ".sql", "--", ["cargo", "nextest", "run", "-p", "idem-sqlite"]),
}
# The tests in three disjoint stages, each run only for a mutant the stages before it
# missed: the conformance suite (which catches most mutants, in seconds), the rest but
# the explorer, then the explorer's sampled run (which takes most of the time). A missed
# mutant meets the whole suite; a caught one costs the stages up to its first failure.
STAGES = [
    ["-E", "binary(conformance)"],
    ["-E", "not binary(conformance) and not binary(explore)"],
    ["-E", "binary(explore)"],
]
# Every command ends at its first failure, the tests still running included: a caught
# mutant costs its first failing test (the workspace's nextest profile runs every test to
# the end, for CI). Not for the baseline, whose failures are all worth reading.
FAIL_FAST = ["--max-fail=1:immediate"]

# What each server says when it cannot compile a statement or script: a mutant that
# fails only so is unviable. Narrow on purpose: a test's name or a runtime error must not
# match (a Lua runtime error is a real catch). A syntax error a test swallows (an error
# counted as a lost answer, say) still counts as caught: see RELIABILITY.md.
SYNTAX_ERRORS = {
    "postgres": re.compile(r"syntax error at or near|syntax error at end of input|\b42601\b"),
    "sqlite": re.compile(r": syntax error|incomplete input"),
    "redis": re.compile(r"Error compiling script"),
}

FLIPS = {"<=": ">", ">=": "<", "<>": "=", "~=": "==", "==": "~=", "<": ">=", ">": "<="}
COMPARISON = re.compile(r"<=|>=|<>|~=|==|(?<![<>~=:!-])<(?![=>-])|(?<![<>~=:-])>(?![=])")
SQL_EQUALS = re.compile(r"(?<=[\w)\]'])\s=\s(?=[\w($'?])")
# Where a condition starts on a line: an `=` after one of these compares.
SQL_CONDITION_START = re.compile(r"\b(WHERE|AND|OR|WHEN|ON|NOT|IF)\b", re.IGNORECASE)
SQL_AND_OR = re.compile(r"\b(AND|OR)\b", re.IGNORECASE)
# NOT in these is not a negated condition: removing it only breaks the syntax or changes
# nothing.
SQL_NOT_KEPT = re.compile(r"^NOT\s+(NULL|EXISTS\s+\w)", re.IGNORECASE)
SQL_SET_LINE = re.compile(r"^(\s*)(\w+)(\s*)=(\s*)(.+?)(,?)\s*$")
LUA_IF = re.compile(r"\b(if|elseif)\s+(.+?)\s+then\b")
LUA_WRITE_CALL = re.compile(r"^\s*(redis\.call|[A-Za-z_][\w.]*)\s*\(")


def code_part(line, comment):
    """The line without its trailing comment (strings with the comment marker in them are
    not looked into: none of our files has one)."""
    at = line.find(comment)
    return line if at < 0 else line[:at]


def balanced(text):
    return text.count("(") == text.count(")")


def assignments(text):
    """The `column = value` parts of a SET list on one line, split at the commas outside
    parentheses and quotes, as (start, end, column, value) with offsets into `text`."""
    parts, depth, quoted, start = [], 0, False, 0
    for at, char in enumerate(text + ","):
        if char == "'":
            quoted = not quoted
        elif not quoted and char == "(":
            depth += 1
        elif not quoted and char == ")":
            depth -= 1
        elif not quoted and depth == 0 and char == ",":
            m = re.match(r"^(\s*)(\w+)\s*=\s*(\S.*?)\s*$", text[start:at])
            if m and depth == 0:
                parts.append((start + len(m.group(1)), at, m.group(2), m.group(3)))
            start = at + 1
    return parts


def mutants_of(path, suffix, comment):
    """Every mutant of one file, as (line number, description, new text)."""
    lines = path.read_text().split("\n")
    found = []

    def add(number, description, replaced):
        found.append((number + 1, description, "\n".join(replaced)))
        # Two mutants of one kind on a line: name them apart by their column.
        same = [m for m in found if m[0] == number + 1 and m[1].split(" (")[0] == description]
        if len(same) > 1:
            found[-1] = (number + 1, f"{description} (#{len(same)})", found[-1][2])

    in_set = False
    for i, line in enumerate(lines):
        code = code_part(line, comment)
        if not code.strip():
            continue
        upper = code.upper()
        # Flip each comparison.
        for match in COMPARISON.finditer(code):
            new = code[: match.start()] + FLIPS[match.group()] + code[match.end():]
            add(i, f"{match.group()} -> {FLIPS[match.group()]}", lines[:i] + [new + line[len(code):]] + lines[i + 1:])
        if suffix == ".sql":
            # An `=` compares only after a condition starts on the line (a SET's `=`
            # assigns).
            condition = SQL_CONDITION_START.search(code)
            if condition:
                for match in SQL_EQUALS.finditer(code, condition.end()):
                    new = code[: match.start()] + " <> " + code[match.end():]
                    add(i, "= -> <>", lines[:i] + [new + line[len(code):]] + lines[i + 1:])
            for match in SQL_AND_OR.finditer(code):
                other = "OR" if match.group().upper() == "AND" else "AND"
                new = code[: match.start()] + other + code[match.end():]
                add(i, f"{match.group().upper()} -> {other}", lines[:i] + [new + line[len(code):]] + lines[i + 1:])
            for match in re.finditer(r"\bNOT\s+", code, re.IGNORECASE):
                if SQL_NOT_KEPT.match(code[match.start():]):
                    continue
                new = code[: match.start()] + code[match.end():]
                add(i, "NOT removed", lines[:i] + [new + line[len(code):]] + lines[i + 1:])
            stripped = code.strip().upper()
            # Drop a condition: a line that is one whole AND/OR term.
            if (stripped.startswith("AND ") or stripped.startswith("OR ")) and balanced(code):
                add(i, "condition dropped", lines[:i] + lines[i + 1:])
            # Remove a write: a SET column keeps its old value (each of a line's
            # `column = value` parts, when the line holds them whole).
            set_word = re.search(r"\bSET\b", code, re.IGNORECASE)
            if set_word and not re.search(r"\bDO\s+UPDATE\s+SET\s*$|\bSET\s*$", code, re.IGNORECASE):
                in_set = True
                after = code[set_word.end():]
                clause_end = re.search(r"\b(WHERE|RETURNING|FROM)\b", after, re.IGNORECASE)
                listed = after[: clause_end.start()] if clause_end else after
                if balanced(listed):
                    for start, end, column, value in assignments(listed.rstrip().rstrip(",")):
                        if value != column:
                            at = set_word.end() + start
                            new = code[:at] + f"{column} = {column}" + code[set_word.end() + end:]
                            add(i, f"write of {column} removed", lines[:i] + [new + line[len(code):]] + lines[i + 1:])
                if clause_end or code.rstrip().endswith(";"):
                    in_set = False
            elif set_word:
                in_set = True
            elif in_set:
                m = SQL_SET_LINE.match(code)
                if m and re.match(r"^\w+$", m.group(2)) and m.group(2).upper() not in ("WHERE", "AND", "OR"):
                    # The value may run over several lines: up to where its parentheses
                    # close and a comma or the clause's end follows.
                    end = i
                    text = code
                    while end + 1 < len(lines):
                        following = code_part(lines[end + 1], comment).strip().upper()
                        if balanced(text) and (
                            text.rstrip().endswith(",")
                            or re.match(r"^(\w+\s*=[^=]|WHERE\b|RETURNING\b|FROM\b|ON\b|;)", following)
                        ):
                            break
                        end += 1
                        text += "\n" + code_part(lines[end], comment)
                    comma = "," if text.rstrip().endswith(",") else ""
                    new = f"{m.group(1)}{m.group(2)} = {m.group(2)}{comma}"
                    if m.group(5).strip().rstrip(",") != m.group(2):
                        add(i, f"write of {m.group(2)} removed", lines[:i] + [new] + lines[end + 1:])
                if re.search(r"\b(WHERE|RETURNING|FROM)\b", upper) or code.rstrip().endswith(";"):
                    in_set = False
        else:
            for match in re.finditer(r"\b(and|or)\b", code):
                other = "or" if match.group() == "and" else "and"
                new = code[: match.start()] + other + code[match.end():]
                add(i, f"{match.group()} -> {other}", lines[:i] + [new + line[len(code):]] + lines[i + 1:])
            for match in re.finditer(r"\bnot\s+", code):
                new = code[: match.start()] + code[match.end():]
                add(i, "not removed", lines[:i] + [new + line[len(code):]] + lines[i + 1:])
            for match in LUA_IF.finditer(code):
                for forced in ("true", "false"):
                    new = code[: match.start(2)] + forced + code[match.end(2):]
                    add(i, f"condition forced {forced}", lines[:i] + [new + line[len(code):]] + lines[i + 1:])
            # Remove a write: a call statement left out (a redis.call or a helper that
            # writes; an assignment or a return is not a statement of this kind).
            if LUA_WRITE_CALL.match(code) and not re.match(r"^\s*(local|return)\b", code):
                end = i
                text = code
                while not balanced(text) and end + 1 < len(lines):
                    end += 1
                    text += "\n" + code_part(lines[end], comment)
                if balanced(text) and re.search(r"\)\s*$", text):
                    add(i, "call statement removed", lines[:i] + lines[end + 1:])
    return found


# nextest's exit status when tests ran and at least one failed.
NEXTEST_TESTS_FAILED = 100


class BrokenBuild(Exception):
    """The tests did not build, or nextest did not run them as asked (a stage's filter
    that selects nothing or does not parse): SQL and Lua reach the crate through
    include_str!, so no mutant can cause that; the run stops."""


def run_tests(target, command, log, limit, append=False):
    """Runs one stage's tests, its output written to `log` (added to it with `append`, so
    a mutant's log keeps every stage it met)."""
    started = time.monotonic()
    # A server test without its server must fail, not skip and pass (a missed mutant).
    env = dict(os.environ, IDEM_REQUIRE_SERVICES="1")
    written = Path(log).stat().st_size if append and Path(log).exists() else 0
    with open(log, "a" if append else "w") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        try:
            status = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return "timeout", time.monotonic() - started
        except BaseException:
            # An interrupt: the tests stop with us.
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    if status == 0:
        return "missed", time.monotonic() - started
    # Only this stage's output is read, as a catch or a broken build is this stage's.
    text = Path(log).read_bytes()[written:].decode(errors="replace")
    if "error[E" in text or "could not compile" in text:
        raise BrokenBuild(f"the tests did not build; see {log}")
    # Only a test that failed is a catch: nextest answers otherwise for a filter that
    # selects no test or does not parse, which would make every mutant look caught.
    if status != NEXTEST_TESTS_FAILED:
        raise BrokenBuild(f"nextest exited with {status}, not a test failure; see {log}")
    return ("unviable" if SYNTAX_ERRORS[target].search(text) else "caught"), time.monotonic() - started


def write_atomically(path, text):
    """Writes through a temporary file and a rename, so an interrupt never leaves a file
    half written."""
    temporary = path.with_name(path.name + ".query-mutant-tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def stop_on_signal(number, _frame):
    raise SystemExit(128 + number)


def line_ranges(spec):
    """`NAME:FIRST[-LAST],...` as (name, first, last) triples; ValueError when malformed."""
    ranges = []
    for item in filter(None, spec.split(",")):
        name, _, span = item.rpartition(":")
        first, dash, last = span.partition("-")
        if dash and not last:
            raise ValueError(item)
        first, last = int(first), int(last or first)
        if not name or "/" in name or name != name.strip() or not 1 <= first <= last:
            raise ValueError(item)
        ranges.append((name, first, last))
    return ranges


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="+", choices=sorted(TARGETS))
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--shard", default="0/1", help="K/N: run every Nth mutant from the Kth")
    parser.add_argument("--files", default="*", help="only files whose name matches one of these globs (comma separated)")
    parser.add_argument(
        "--lines",
        default=None,
        help="only mutants on these lines: NAME:FIRST[-LAST],... (NAME a file's name, such "
        "as claim.lua), say the lines a change touched",
    )
    parser.add_argument("--timeout", type=int, default=900, help="seconds per mutant's tests")
    parser.add_argument(
        "--iterate",
        action="store_true",
        help="skip mutants an earlier run caught or found unviable, and add to its lists",
    )
    args = parser.parse_args()
    shard, shards = (int(n) for n in args.shard.split("/"))
    if not 0 <= shard < shards:
        parser.error("--shard K/N needs 0 <= K < N")
    lines = None
    if args.lines is not None:
        try:
            lines = line_ranges(args.lines)
        except ValueError:
            parser.error("--lines needs NAME:FIRST[-LAST],... with a file's name and 1 <= FIRST <= LAST")
        if not lines:
            # An empty list (a substitution that came out empty) must not mean "every line".
            parser.error("--lines names no line")
        known = {
            p.name
            for target in args.targets
            for p in (ROOT / TARGETS[target][0]).glob("*" + TARGETS[target][1])
            if any(fnmatch.fnmatch(p.name, pattern) for pattern in args.files.split(","))
        }
        unknown = sorted({name for name, _, _ in lines} - known)
        if unknown:
            parser.error(f"--lines names no file of these targets and --files: {', '.join(unknown)}")

    # SIGTERM and SIGHUP unwind like an interrupt, so every file is restored.
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, stop_on_signal)
    status = 0
    for target in args.targets:
        directory, suffix, comment, command = TARGETS[target]
        files = sorted(
            p
            for p in (ROOT / directory).glob("*" + suffix)
            if any(fnmatch.fnmatch(p.name, pattern) for pattern in args.files.split(","))
        )
        mutants = [(f, *m) for f in files for m in mutants_of(f, suffix, comment)]
        if lines is not None:
            mutants = [
                m
                for m in mutants
                if any(m[0].name == name and first <= m[1] <= last for name, first, last in lines)
            ]
        mutants = mutants[shard::shards]
        print(f"query mutants: {target}, {len(mutants)} mutant(s) in {len(files)} file(s)", flush=True)
        if args.list:
            for path, line, description, _ in mutants:
                print(f"  {path.relative_to(ROOT)}:{line}: {description}")
            continue
        # The originals come from a clean tree: a mutant left behind by a killed run must
        # not become the next run's original.
        if subprocess.run(["git", "diff", "--quiet", "--", directory], cwd=ROOT).returncode != 0:
            print(f"query mutants: {directory} has uncommitted changes; commit or restore them first")
            return 2
        originals = {path: path.read_text() for path in files}
        out = ROOT / "target" / "query-mutants" / target
        out.mkdir(parents=True, exist_ok=True)
        # The baseline runs the stages the mutants meet: each must select tests, and pass.
        took = 0.0
        for number, stage in enumerate(STAGES):
            outcome, more = run_tests(
                target, command + stage, out / "baseline.log", args.timeout, append=number > 0
            )
            took += more
            if outcome != "missed":
                print(f"query mutants: {target}: the unmutated tests did not pass ({outcome}); see {out / 'baseline.log'}")
                return 2
        print(f"  baseline passed in {took:.0f} s", flush=True)
        results = {"caught": [], "missed": [], "unviable": [], "timeout": []}
        here = {f"{path.relative_to(ROOT)}:{line}: {description}" for path, line, description, _ in mutants}
        settled = set()
        if args.iterate:
            for outcome in results:
                listed = out / f"{outcome}.txt"
                if listed.exists():
                    names = listed.read_text().splitlines()
                    if outcome in ("caught", "unviable"):
                        settled.update(names)
                    else:
                        # Tried again when in this run; kept when another run's.
                        names = [name for name in names if name not in here]
                    results[outcome] = names
        # The lists are rewritten as the run goes: a run stopped part way keeps what it
        # learned, for --iterate to go on from.
        for outcome, names in results.items():
            write_atomically(out / f"{outcome}.txt", "".join(f"{name}\n" for name in names))
        for n, (path, line, description, text) in enumerate(mutants, 1):
            name = f"{path.relative_to(ROOT)}:{line}: {description}"
            if name in settled:
                continue
            try:
                write_atomically(path, text)
                took = 0.0
                for number, stage in enumerate(STAGES):
                    outcome, more = run_tests(
                        target,
                        command + FAIL_FAST + stage,
                        out / "mutant.log",
                        args.timeout,
                        append=number > 0,
                    )
                    took += more
                    if outcome != "missed":
                        break
            finally:
                # A second signal during the restore must not leave the mutant in place.
                stops = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
                signal.pthread_sigmask(signal.SIG_BLOCK, stops)
                try:
                    write_atomically(path, originals[path])
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
            if outcome in ("missed", "timeout"):
                (out / f"{outcome}-{n}.log").write_text((out / "mutant.log").read_text(errors="replace"))
            results[outcome].append(name)
            write_atomically(out / f"{outcome}.txt", "".join(f"{name}\n" for name in results[outcome]))
            print(f"  [{n}/{len(mutants)}] {outcome:8} {name} ({took:.0f} s)", flush=True)
        summary = ", ".join(
            f"{sum(name in here for name in names)} {outcome}" for outcome, names in results.items()
        )
        (out / "outcomes.txt").write_text(f"{len(mutants)} mutants: {summary}\n")
        print(f"query mutants: {target}: {len(mutants)} mutants: {summary}", flush=True)
        if any(name in here for name in results["missed"] + results["timeout"]):
            status = 1
    return status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenBuild as stop:
        # Every file is restored by then (main's finally): say why and stop.
        print(f"query mutants: stopped: {stop}", file=sys.stderr)
        sys.exit(2)
