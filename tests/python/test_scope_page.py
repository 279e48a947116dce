"""docs/scope.md holds true: its worked example (nn.MultiheadAttention(16, 2) exported and
evaluated) runs as printed and gives the options it prints and PyTorch's velocity, and every
page it links exists."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE = REPO_ROOT / "docs" / "scope.md"


def test_the_worked_example_runs_as_printed(mfattn, tmp_path, monkeypatch):
    torch = __import__("torch")
    text = PAGE.read_text()
    code = text.split("### Worked example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(code, str(PAGE), "exec"), scope)  # noqa: S102  (the page's own example)
    printed = eval(re.search(r"# (\{'d': 16.*?\})", code, flags=re.S).group(1).replace("\n#", ""))  # noqa: S307
    assert scope["options"] == dict(printed, weights="mha.h5")
    mha, x, v = scope["mha"].double(), scope["x"], scope["v"]
    with torch.no_grad():
        y = torch.from_numpy(x)[:, None, :]
        out = mha(y, y, y, need_weights=False)[0][:, 0, :].numpy()
    tangent = out - np.sum(out * x, axis=1, keepdims=True) * x
    np.testing.assert_allclose(v, tangent, atol=1e-12)


def test_every_linked_page_exists():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", PAGE.read_text()):
        assert (PAGE.parent / target).exists(), target
