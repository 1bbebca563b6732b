#!/usr/bin/env python3
"""Expands the hand-written coordinator scenarios (tests/coordinator_scenarios/hand.txt) into
one JSON file each, in the format of COORDINATOR-SCENARIOS.md. It computes nothing: every
result, start, removal and state is written by hand in the notation below; this only spells it
out as JSON (and copies the last state into `final`).

Notation, one scenario per block separated by a line `---`:
  name: <file name>            row: <seed-matrix row>     comment: <seed sentence>
  desc: <what it shows>        hung: t1 t2                choices: C3
  config: C=<clientLimit> Q=<queueCap> E0=<elapsedStart> <prov>:<limit|->:<minInterval> ...
  then one line per step:  <op and args> | <result> | <started> | <removed> | <state> [| <events>]
    ops: submit <id> <prov> <key> <timeout|->, complete <id>, cancel <id>,
         cooldown <prov> <delay>, advance <ms>, wall <delta>, close
    started: ids separated by commas, or -;  removed: id:reason,... or -
    state: now=<ms> in=<clientInFlight> [closed] <prov>=<inFlight>,<cool|->,<paced|->
           run=<key>:<id>,...  q=<id>,...   (empty lists: run= q=)
    events: <kind>:<id>@<at>,...
  final: <id>=<status> ...
"""
import json, sys, pathlib

root = pathlib.Path(__file__).resolve().parent.parent / "tests" / "coordinator_scenarios"

def lst(s):
    s = s.strip()
    return [] if s in ("", "-") else [x.strip() for x in s.split(",")]

def nul(s):
    return None if s == "-" else int(s)

def state(s, provs):
    st = {"now": None, "closed": False, "clientInFlight": None, "providers": {}, "running": {}, "queue": []}
    for tok in s.split():
        if tok == "closed":
            st["closed"] = True
            continue
        k, _, v = tok.partition("=")
        if k == "now": st["now"] = int(v)
        elif k == "in": st["clientInFlight"] = int(v)
        elif k == "run": st["running"] = {kv.split(":")[0]: kv.split(":")[1] for kv in lst(v)}
        elif k == "q": st["queue"] = lst(v)
        elif k in provs:
            a, c, p = v.split(",")
            st["providers"][k] = {"inFlight": int(a), "coolingUntil": nul(c), "pacedUntil": nul(p)}
        else: raise SystemExit(f"bad state token {tok!r}")
    assert list(st["providers"]) == provs, f"state must list every provider in order: {s}"
    st["running"] = dict(sorted(st["running"].items()))
    return st

def step(line, provs):
    parts = [p.strip() for p in line.split("|")]
    op = parts[0].split()
    s = {"op": op[0]}
    if op[0] == "submit":
        s.update(id=op[1], provider=op[2], key=op[3], admissionTimeout=nul(op[4]))
    elif op[0] in ("complete", "cancel"): s["id"] = op[1]
    elif op[0] == "cooldown": s.update(provider=op[1], delay=int(op[2]))
    elif op[0] == "advance": s["ms"] = int(op[1])
    elif op[0] == "wall": s["delta"] = int(op[1])
    elif op[0] != "close": raise SystemExit(f"bad op {line}")
    e = {"result": parts[1], "started": lst(parts[2]),
         "removed": [{"id": r.split(":")[0], "reason": r.split(":")[1]} for r in lst(parts[3])],
         "state": state(parts[4], provs)}
    if len(parts) > 5:
        e["events"] = [{"at": int(x.split("@")[1]), "kind": x.split(":")[0], "id": x.split(":")[1].split("@")[0]}
                       for x in lst(parts[5])]
    s["expect"] = e
    return s

def scenario(block):
    meta, steps, provs, cfg = {}, [], [], None
    for line in block.strip().splitlines():
        if not line.strip() or line.startswith("#"): continue
        head = line.split(":", 1)[0]
        if head in ("name", "row", "comment", "desc", "hung", "choices", "final") and "|" not in line:
            meta[head] = line.split(":", 1)[1].strip()
        elif line.startswith("config:"):
            cfg = {"providers": []}
            for tok in line.split(":", 1)[1].split():
                if tok.startswith("C="): cfg["clientLimit"] = int(tok[2:])
                elif tok.startswith("Q="): cfg["queueCap"] = int(tok[2:])
                elif tok.startswith("E0="): cfg["elapsedStart"] = int(tok[3:])
                else:
                    n, l, m = tok.split(":")
                    provs.append(n)
                    cfg["providers"].append({"name": n, "limit": nul(l), "minInterval": int(m)})
            cfg["wallStart"] = 1700000000000
        else:
            steps.append(step(line, provs))
    out = {"format": 1, "name": meta["name"], "kind": "hand"}
    if "row" in meta: out["seedRow"] = meta["row"]
    if "comment" in meta: out["comment"] = meta["comment"]
    if "desc" in meta: out["description"] = meta["desc"]
    if "hung" in meta: out["hung"] = meta["hung"].split()
    out["config"] = cfg
    out["choices"] = meta["choices"].split() if "choices" in meta else []
    out["final"] = {"tickets": dict(sorted((kv.split("=") for kv in meta["final"].split()))),
                    "state": steps[-1]["expect"]["state"]}
    out["steps"] = steps
    return out

def main():
    text = (root / "hand.txt").read_text()
    for block in text.split("\n---\n"):
        if not block.strip(): continue
        s = scenario(block)
        body = ",\n".join(json.dumps(x) for x in s["steps"])
        head = {k: v for k, v in s.items() if k != "steps"}
        js = json.dumps(head, indent=1)[:-2] + ',\n "steps": [\n' + body + "\n ]\n}\n"
        (root / f"{s['name']}.json").write_text(js)
        print(s["name"])

if __name__ == "__main__":
    main()
