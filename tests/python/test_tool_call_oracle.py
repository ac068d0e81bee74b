"""The tool-call oracle (tool_call_oracle.py) is what the real templates render today: the
committed tests/fixtures/tool_calls/rendered_calls.json, which the C++ parsers are tested against
(tests/unit/test_tool_call_parsers.cc), must equal a fresh rendering with Python jinja2."""
import json

import tool_call_oracle


def test_committed_cases_match_the_templates():
    with open(tool_call_oracle.OUT, encoding="utf-8") as f:
        committed = json.load(f)
    assert committed == tool_call_oracle.cases(), \
        "rendered_calls.json is stale: run tests/python/tool_call_oracle.py"


def test_every_family_and_edge_case_is_covered():
    cases = tool_call_oracle.cases()
    families = {c["family"] for c in cases}
    assert families == {"hermes", "llama3_json", "mistral", "deepseek_v3", "harmony"}
    names = {(c["family"], c["case"]) for c in cases}
    for family in families:
        assert (family, "one_call") in names and (family, "no_call") in names
    for family in ("hermes", "mistral", "deepseek_v3"):
        assert (family, "two_calls") in names
    for family in ("hermes", "llama3_json", "mistral", "deepseek_v3"):
        assert (family, "end_marker_in_argument") in names
    # The rendered text holds each family's own markup (the cases are not vacuous).
    markers = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3_json": '"parameters"',
               "deepseek_v3": "<｜tool▁calls▁begin｜>", "harmony": "to=functions."}
    for c in cases:
        if c["case"] != "no_call":
            assert markers[c["family"]] in c["output"]
