"""Compares two benchmark runs of the same benchmarks: every number in <dir>/<bench>-before.json
beside the same number in <dir>/<bench>-after.json (bench/compare_trees.sh writes them), as the
ratio after/before. Times and rates of fp8amp's own cases are what a refactoring must leave alone;
the peers' numbers (torch.*) in the same files show the run-to-run noise of the machine.
A line is marked "!" where the ratio is off by more than 2%.
Usage: python3 bench/compare_results.py DIR"""
import glob
import json
import os
import sys


def leaves(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, path + (str(key),))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield "/".join(path), float(node)


def main(folder):
    worst = {}
    for before_path in sorted(glob.glob(os.path.join(folder, "*-before.json"))):
        name = os.path.basename(before_path)[: -len("-before.json")]
        after_path = os.path.join(folder, name + "-after.json")
        if not os.path.exists(after_path):
            print(f"{name}: no after run")
            continue
        with open(before_path) as f:
            before = dict(leaves(json.load(f)))
        with open(after_path) as f:
            after = dict(leaves(json.load(f)))
        print(f"== {name}")
        for key, b in before.items():
            if key not in after or b == 0:
                continue
            ratio = after[key] / b
            flag = "!" if abs(ratio - 1) > 0.02 else " "
            print(f"{flag} {key:70s} {b:14.4f} {after[key]:14.4f} {ratio:8.4f}")
            if "fp8amp" in key:
                worst[name] = max(worst.get(name, 0.0), abs(ratio - 1))
    for name, w in worst.items():
        print(f"{name}: largest change of an fp8amp number {w * 100:.2f}%")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build-compare")
