"""Configs are parsed with libyaml when the text is short (issue 30 item 9: listing 500 never-listed
run folders parsed 500 config snapshots in pure Python, most of the listing): the same data as the
pure-Python parser, and bad text still gets the pure-Python parser's own words."""

from __future__ import annotations

import pytest

from workbench.config import JobConfig, yamlfile
from workbench.config.presets import PRESETS, preset

pytestmark = pytest.mark.timeout(60)


def _read(text: str) -> object:
    try:
        return yamlfile.load(text)
    except yamlfile.YamlProblem as exc:
        return str(exc)


def _pure(text: str, monkeypatch: pytest.MonkeyPatch) -> object:
    with monkeypatch.context() as patch:
        patch.setattr(yamlfile, "C_MAX_BYTES", -1)
        return _read(text)


@pytest.mark.parametrize("text", [JobConfig().to_yaml(), *(preset(name).to_yaml() for name in PRESETS),
                                  "a: 1:30:00\nb: 5e-5\nc: [1, {d: null, e: yes}]\n", "x: &a [1, 2]\ny: *a\n",
                                  *("a: " + "[" * n + "1" + "]" * n for n in (61, 62, 63)),  # at the depth limit
                                  *("a:\n" + "".join(" " * i + "- \n" for i in range(0, 2 * n, 2)) for n in (62, 63))])
def test_short_text_reads_the_same_with_libyaml(text, monkeypatch):
    assert yamlfile._c_loader() is not None
    assert _read(text) == _pure(text, monkeypatch)


@pytest.mark.parametrize("text", ["a: " + "[" * 70 + "]" * 70, "a: 1\na: 2\n", "a: !!python/name:os.system x\n",
                                  "a: [1, 2\n", "{1: 2}\n", "a: &a [*a]\n"])
def test_bad_short_text_is_said_in_the_pure_python_parsers_words(text, monkeypatch):
    with pytest.raises(yamlfile.YamlProblem) as caught:
        yamlfile.load(text)
    assert str(caught.value) == _pure(text, monkeypatch)
