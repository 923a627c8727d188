"""`m27 deploy`'s parameter schema: Prefect's run form asks for each {{VAR}} by name."""

from __future__ import annotations

from prefect.utilities.callables import parameter_schema

from flows.pipeline import pipeline_flow
from m27.lab.deploy import DeploymentSpec

BASE = parameter_schema(pipeline_flow.fn).model_dump_for_openapi()


def _spec(**kw: object) -> DeploymentSpec:
    return DeploymentSpec(name="d", spec_path="/p.yaml", pipeline_name="p", overrides={}, **kw)  # type: ignore[arg-type]


def test_overrides_name_each_variable_with_the_value_a_run_gets_and_require_the_unset() -> None:
    schema = _spec(variables={"STEPS": "5000", "OUT": "runs"}, each_run=("TEMP",)).parameter_schema(
        BASE
    )
    overrides = schema["properties"]["overrides"]
    assert overrides["type"] == "object" and overrides["required"] == ["TEMP"]
    assert overrides["properties"] == {
        "STEPS": {"type": "string", "title": "STEPS", "default": "5000"},
        "OUT": {"type": "string", "title": "OUT", "default": "runs"},
        "TEMP": {"type": "string", "title": "TEMP"},
    }
    assert overrides["additionalProperties"] == {"type": "string"}
    assert overrides["position"] == BASE["properties"]["overrides"]["position"]
    # the other parameters, and the flow's own schema, are as they were
    assert {k: v for k, v in schema["properties"].items() if k != "overrides"} == {
        k: v for k, v in BASE["properties"].items() if k != "overrides"
    }
    assert "properties" not in BASE["properties"]["overrides"]


def test_a_pipeline_without_variables_keeps_the_flows_schema() -> None:
    assert _spec().parameter_schema(BASE) == BASE


def test_the_run_form_says_how_to_give_a_list_variables_values() -> None:
    schema = _spec(variables={"TEMPS": "300 310"}, lists=("TEMPS",)).parameter_schema(BASE)
    assert schema["properties"]["overrides"]["properties"]["TEMPS"] == {
        "type": "string",
        "title": "TEMPS",
        "default": "300 310",
        "description": "a list: values separated by blanks or commas",
    }
