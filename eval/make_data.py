"""Generate the offline evaluation data shipped in ``hfcompress/eval/data/`` (a developer
tool: it lives in the repository, not in the installed package).

Arithmetic word problems with checkable answers, written in two public formats:

- MMLU (``cais/mmlu`` rows): ``question``, ``subject``, ``choices`` (4 numbers), ``answer``
  (index 0-3). The correct answer's rank among the sorted choices is uniform, so neither the
  letter nor "pick the middle number" beats the 25 % chance rate.
- GSM8K (``openai/gsm8k`` rows): ``question``, ``answer`` = worked steps with ``<<a+b=c>>``
  calculator annotations and a final ``#### c`` line.

Deterministic (``random.Random(seed)``). ``python eval/make_data.py`` rewrites the
files; ``--check`` verifies the shipped files equal a fresh generation.
``reworded_test_problems`` restates the test arithmetic with other names and things (for
the toy model of ``toy.py``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "hfcompress" / "eval" / "data"
SEED = 1234
SUBJECT = "elementary_arithmetic"
SIZES = {"test": 300, "dev": 5, "gsm_train": 100}  # dev = MMLU's few-shot split
NAMES = ["Ava", "Ben", "Cleo", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jade", "Kai",
         "Lena", "Milo", "Nora", "Omar", "Pia", "Quinn", "Rosa", "Sam", "Tara"]
THINGS = ["apples", "books", "coins", "marbles", "pencils", "shells", "stamps", "stickers",
          "cards", "beads"]
KINDS = ("add", "sub", "mul", "add_sub")


def _numbers(rng: random.Random, kind: str) -> tuple[int, ...]:
    if kind == "add":
        return rng.randint(1, 20), rng.randint(1, 20)
    if kind == "sub":
        a = rng.randint(2, 30)
        return a, rng.randint(1, a - 1)
    if kind == "mul":
        return rng.randint(2, 12), rng.randint(2, 12)
    a, b = rng.randint(1, 15), rng.randint(1, 15)
    return a, b, rng.randint(1, a + b - 1)


def render(kind: str, nums: tuple[int, ...], n: str, t: str) -> dict:
    """A word problem about person ``n`` and things ``t``: its text, worked GSM8K-style steps
    and the integer answer."""
    a, b = nums[:2]
    if kind == "add":
        c = a + b
        q = f"{n} has {a} {t}. {n} gets {b} more {t}. How many {t} does {n} have now?"
        steps = [f"{n} has {a} + {b} = <<{a}+{b}={c}>>{c} {t} now."]
    elif kind == "sub":
        c = a - b
        q = f"{n} has {a} {t} and gives {b} of them away. How many {t} does {n} have left?"
        steps = [f"{n} has {a} - {b} = <<{a}-{b}={c}>>{c} {t} left."]
    elif kind == "mul":
        c = a * b
        q = f"{n} buys {a} bags with {b} {t} in each bag. How many {t} does {n} buy?"
        steps = [f"{n} buys {a} * {b} = <<{a}*{b}={c}>>{c} {t}."]
    else:
        d, s = nums[2], a + b
        c = s - d
        q = (f"{n} has {a} {t}, buys {b} more and then gives {d} away. "
             f"How many {t} does {n} have left?")
        steps = [f"After buying, {n} has {a} + {b} = <<{a}+{b}={s}>>{s} {t}.",
                 f"After giving some away, {n} has {s} - {d} = <<{s}-{d}={c}>>{c} {t} left."]
    return {"kind": kind, "nums": tuple(nums), "name": n, "thing": t, "question": q,
            "steps": steps, "target": c}


def _problem(rng: random.Random, kind: str) -> dict:
    n, t = rng.choice(NAMES), rng.choice(THINGS)
    return render(kind, _numbers(rng, kind), n, t)


def _key(p: dict) -> tuple:
    return (p["kind"], p["nums"])


def _distinct_problems(rng: random.Random, count: int, exclude: set) -> list[dict]:
    out, seen = [], set(exclude)
    for _ in range(100 * count):
        if len(out) == count:
            return out
        p = _problem(rng, KINDS[len(out) % len(KINDS)])
        if _key(p) not in seen:
            seen.add(_key(p))
            out.append(p)
    raise RuntimeError(f"cannot draw {count} distinct problems: widen the number ranges")


def mmlu_row(p: dict, rng: random.Random) -> dict:
    """MMLU row: 3 distractors near the answer, the answer's rank drawn uniformly from 0-3."""
    c = p["target"]
    offsets = [1, 2, 3, 4, 5, 10]
    below = [c - o for o in offsets if c - o >= 0]
    above = [c + o for o in offsets]
    k = rng.randint(0, min(3, len(below)))  # number of distractors below the answer
    choices = sorted(rng.sample(below, k) + rng.sample(above, 3 - k) + [c])
    return {"question": p["question"], "subject": SUBJECT, "choices": [str(x) for x in choices],
            "answer": choices.index(c)}


def gsm8k_row(p: dict) -> dict:
    return {"question": p["question"], "answer": "\n".join(p["steps"]) + f"\n#### {p['target']}"}


def build(seed: int = SEED) -> dict[str, list[dict]]:
    """All shipped files: name -> rows. Test problems are distinct; few-shot rows are disjoint."""
    rng = random.Random(seed)
    test = _distinct_problems(rng, SIZES["test"], set())  # == test_problems(seed)
    shots = _distinct_problems(rng, SIZES["dev"] + SIZES["gsm_train"], {_key(p) for p in test})
    dev, gsm_train = shots[:SIZES["dev"]], shots[SIZES["dev"]:]
    return {
        "arith_mmlu_test.jsonl": [mmlu_row(p, rng) for p in test],
        "arith_mmlu_dev.jsonl": [mmlu_row(p, rng) for p in dev],
        "arith_gsm8k_test.jsonl": [gsm8k_row(p) for p in test],
        "arith_gsm8k_train.jsonl": [gsm8k_row(p) for p in gsm_train],
    }


def test_problems(seed: int = SEED) -> list[dict]:
    """The problems behind the test files, in file order."""
    return _distinct_problems(random.Random(seed), SIZES["test"], set())


def reworded_test_problems(count: int, seed: int = 0) -> list[dict]:
    """``count`` problems with the arithmetic (kind and numbers) of random test items but
    another person and other things, so never a test question's text. For a toy model that
    has learned these sums (a check that the harness scores a model that knows the answers
    above chance), not for measuring generalization."""
    rng, test, out = random.Random(seed), test_problems(), []
    for _ in range(count):
        p = rng.choice(test)
        n = rng.choice([x for x in NAMES if x != p["name"]])
        t = rng.choice([x for x in THINGS if x != p["thing"]])
        out.append(render(p["kind"], p["nums"], n, t))
    return out


def _dumps(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DATA_DIR)
    ap.add_argument("--check", action="store_true", help="verify the files instead of writing")
    args = ap.parse_args(argv)
    bad = []
    for name, rows in build().items():
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != _dumps(rows):
                bad.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(_dumps(rows), encoding="utf-8")
            print(f"wrote {len(rows):4d} rows to {path}")
    if bad:
        print("out of date (run python eval/make_data.py):", *bad, sep="\n  ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
