#!/usr/bin/env bash
# Checks the alerting rules and the dashboard in monitoring/:
# - `promtool check rules` and `promtool test rules` on both test files (every alert fires
#   on series made to trip it and stays quiet on a healthy service's);
# - every dashboard query is valid PromQL (promtool checks each as a recording rule);
# - every metric the rules and the dashboard name is one idem emits: idem-core's
#   `observe` constants and the families of `idem stats --prometheus`.
# Installs promtool (Debian's prometheus package) where it is missing, which needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null; then
  command -v apt-get >/dev/null || { echo "check-monitoring: promtool is missing: install Prometheus" >&2; exit 1; }
  echo "check-monitoring: installing promtool (Debian's prometheus package)" >&2
  apt-get update -qq >&2
  # The package starts its own server after installing; a policy-rc.d that forbids it
  # keeps the machine as we found it.
  policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2 || {
    ((made_policy)) && rm -f "$policy"
    echo "check-monitoring: apt-get install prometheus failed" >&2
    exit 1
  }
  ((made_policy)) && rm -f "$policy"
fi

rules=monitoring/prometheus/idem.rules.yml
tests=(monitoring/prometheus/idem.rules.test.yml monitoring/prometheus/idem.rules.days.test.yml)
dashboard=monitoring/grafana/idem.json

promtool check rules "$rules"
for file in "${tests[@]}"; do
  (cd "$(dirname "$file")" && promtool test rules "$(basename "$file")")
done

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 - "$rules" "$dashboard" "$scratch/dashboard.rules.yml" <<'PY'
import json, re, sys

rules_path, dashboard_path, out_path = sys.argv[1:]
emitted = set()
for path, pattern in [
    ("idem-core/src/driver/observe.rs", r'pub const \w+: &str = "(idem_\w+)"'),
    ("idem-cli/src/commands/stats.rs", r'"(idem_store_\w+)",'),
]:
    found = set(re.findall(pattern, open(path).read()))
    if not found:
        sys.exit(f"check-monitoring: found no metric names in {path}; has it moved?")
    emitted |= found

dashboard = json.load(open(dashboard_path))
exprs = []
def walk(panels):
    for panel in panels:
        walk(panel.get("panels", []))
        for target in panel.get("targets", []):
            exprs.append((panel["title"], target["expr"]))
walk(dashboard["panels"])
if not exprs:
    sys.exit("check-monitoring: the dashboard has no queries")

# Each query as a recording rule, Grafana's variables replaced, for promtool to parse.
with open(out_path, "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (_, expr) in enumerate(exprs):
        concrete = expr.replace("$__rate_interval", "5m").replace("$job", ".*")
        out.write(f"      - record: dashboard_query_{i}\n        expr: {json.dumps(concrete)}\n")

metric = re.compile(r"\bidem_[a-z_]*[a-z]\b")
# The rules' code, not their comments.
code = "\n".join(line for line in open(rules_path) if not line.lstrip().startswith("#"))
named = set(metric.findall(code))
for title, expr in exprs:
    named |= set(metric.findall(expr))
# A histogram's series are its name with _bucket, _sum and _count.
named = {re.sub(r"_(bucket|sum|count)$", "", name) if re.sub(r"_(bucket|sum|count)$", "", name) in emitted else name for name in named}
unknown = sorted(named - emitted)
if unknown:
    sys.exit(f"check-monitoring: metrics idem does not emit: {', '.join(unknown)}")
print(f"check-monitoring: {len(exprs)} dashboard queries; {len(named)} metrics named, all emitted by idem")
PY
promtool check rules "$scratch/dashboard.rules.yml"
