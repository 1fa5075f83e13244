"""The one capability catalog: diagnose and environments read the same names and texts."""

from __future__ import annotations

from trace_lib import capabilities
from trace_lib.diagnose import capability_curation as diagnose_caps
from trace_lib.envs.capabilities import CAPABILITIES
from trace_lib.workbench import environments


def test_environments_describe_capabilities_with_the_catalog_text():
    assert set(CAPABILITIES) == set(capabilities.CORE)
    for name, spec in CAPABILITIES.items():
        assert spec.description == capabilities.BY_NAME[name].description


def test_diagnose_seeds_its_menu_from_the_same_catalog(db_path):
    assert diagnose_caps.BUILTIN is capabilities.BUILTIN
    menu = {c.name: c.description for c in diagnose_caps.list_capabilities(db_path)}
    for b in capabilities.BUILTIN:
        assert menu[b.name] == b.description


def test_built_in_environments_and_the_generator_menu_use_it():
    assert environments.capability_names() == sorted(capabilities.CORE)
    spec = environments.resolve("airline/precondition_verification")
    assert spec.description == capabilities.description("precondition_verification")
    assert capabilities.description("not_a_capability") == ""
