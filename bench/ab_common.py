"""What the interleaved A/B scripts of bench/ share: their command line (two binaries and a
number of rounds) and the order of a round (A then B in even rounds, B then A in odd ones, so
that a drift of the machine weighs on both alike)."""
from __future__ import annotations

import argparse


def ab_parser(doc: str, rounds: int) -> argparse.ArgumentParser:
    """The parser of --a (baseline binary), --b (binary under test) and --rounds."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="the baseline binary")
    parser.add_argument("--b", required=True, help="the binary under test")
    parser.add_argument("--rounds", type=int, default=rounds)
    return parser


def round_order(round_index: int) -> tuple[str, str]:
    """Which binary runs first in this round: "a" then "b", or "b" then "a"."""
    return ("a", "b") if round_index % 2 == 0 else ("b", "a")
