"""No choice value is compared as a string outside its table. Every choice option's accepted
names live once in a table (Choice<...> arrays, include/mfattn/core/choice_table.hpp); the
code that acts on an option reads the typed value the table gives, never the text. A compare
with one of the names (`kernel == "sa"`, `"rk4" != name`, `.starts_with("rope")`) would go
stale with the next entry of the table, so this test fails on any."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# {"name", ...} entries of the Choice<...> arrays and of the registries of integrators and
# backends, which are tables of the same kind (a name and what it makes).
TABLE = re.compile(r"(?:inline constexpr Choice<[^>]+>|const IntegratorEntry|inline constexpr BackendName) "
                   r"k\w+\[\] = \{(.*?)\n\};", re.S)
ENTRY = re.compile(r'\{\s*"([^"]+)"\s*,')
# Names that are also words of other options, compared for what they are there: "all" is
# also analyze's --replica all; the test would otherwise flag those compares.
ORDINARY_WORDS = {"all", "auto", "none"}


def choice_names() -> set[str]:
    names = set()
    for header in sorted([*(ROOT / "include").rglob("*.hpp"), *(ROOT / "src").rglob("*.cpp")]):
        for table in TABLE.findall(header.read_text()):
            names.update(ENTRY.findall(table))
    return names


def test_the_tables_are_found():
    names = choice_names()
    # A sample of every kind of table: kernel, integrator, mask, activation, meanfield's own.
    for name in ("sa", "usa", "sinkhorn", "rk4", "causal", "gelu", "rope", "uniform", "cuda"):
        assert name in names, name
    assert len(names) > 40


def compares(text: str, name: str) -> bool:
    quoted = re.escape(f'"{name}"')
    pattern = (rf"(==|!=)\s*{quoted}|{quoted}\s*(==|!=)|"
               rf"\.(compare|starts_with|ends_with|find|rfind)\(\s*{quoted}")
    return re.search(pattern, text) is not None


def test_no_choice_value_is_compared_as_a_string():
    names = choice_names() - ORDINARY_WORDS
    wrong = []
    for root in (ROOT / "src", ROOT / "include", ROOT / "python"):
        for path in sorted(root.rglob("*")):
            if path.suffix not in {".cpp", ".hpp", ".cu"}:
                continue
            text = re.sub(r"//[^\n]*", "", path.read_text())  # comments may quote a name
            for line_number, line in enumerate(text.splitlines(), 1):
                for name in names:
                    if f'"{name}"' in line and compares(line, name):
                        wrong.append(f"{path.relative_to(ROOT)}:{line_number}: {line.strip()}")
    assert not wrong, "compared as text, not through the option's table:\n" + "\n".join(wrong)


def test_the_check_sees_a_compare():
    assert compares('if (cfg.kernel == "sa") {', "sa")
    assert compares('if ("rk4" != name)', "rk4")
    assert compares('if (mask.starts_with("causal"))', "causal")
    assert not compares('kernel = "sa";', "sa")
