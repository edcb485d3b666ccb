import pytest
import torch

from fedprivopt.models import (
    ToyClassificationTask,
    build_task,
    initial_flat,
    model_spec,
    primary_metric,
    register_task,
    state_to_flat,
    task_names,
)
from fedprivopt.models import registry as registry_module
from fedprivopt.models.task import evaluating
from fedprivopt.privacy import flatten


def test_model_spec_and_initial_flat():
    task = ToyClassificationTask(dim=6, num_classes=4, seed=2)
    spec = model_spec(task)
    assert spec.names == ("weight", "bias")
    assert spec.numel == 6 * 4 + 4
    flat = initial_flat(task)
    assert flat.shape == (spec.numel,) and flat.dtype == torch.float32
    assert torch.equal(flat[:24], task.build_model().weight.detach().reshape(-1))


def test_primary_metric_is_the_tasks_own_or_accuracy():
    assert primary_metric(ToyClassificationTask(dim=3, num_classes=2)) == "eval_accuracy"

    class Named(ToyClassificationTask):
        primary_metric = "recall_at_5"

    assert primary_metric(Named(dim=3, num_classes=2)) == "eval_recall_at_5"
    Named.primary_metric = ""
    with pytest.raises(TypeError, match=r"Named\.primary_metric must be a metric name"):
        primary_metric(Named(dim=3, num_classes=2))


def test_state_to_flat_reorders_and_checks():
    task = ToyClassificationTask(dim=3, num_classes=2)
    spec = model_spec(task)
    state = task.build_model().state_dict()
    reordered = {"bias": state["bias"], "weight": state["weight"].double()}
    flat = state_to_flat(reordered, spec)
    assert flat.dtype == torch.float32
    assert torch.allclose(flat, flatten(state)[0])
    with pytest.raises(ValueError, match="missing"):
        state_to_flat({"weight": state["weight"]}, spec)
    with pytest.raises(ValueError, match="unexpected"):
        state_to_flat({**state, "extra": torch.zeros(1)}, spec)
    with pytest.raises(ValueError, match="shape"):
        state_to_flat({"weight": torch.zeros(3, 2), "bias": state["bias"]}, spec)


def test_registry_builds_toy_and_rejects_unknown_names():
    assert "toy" in task_names()
    task = build_task("toy", num_users=4, seed=1)
    assert isinstance(task, ToyClassificationTask) and task.num_users == 4
    with pytest.raises(ValueError, match=r"unknown task 'nope'.*toy"):
        build_task("nope")
    with pytest.raises(ValueError, match="num_users"):
        build_task("toy", num_users=0)


def test_register_task(monkeypatch):
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    register_task("toy2", ToyClassificationTask)
    assert build_task("toy2", num_users=2).num_users == 2
    with pytest.raises(ValueError, match="already registered"):
        register_task("toy", ToyClassificationTask)
    with pytest.raises(ValueError, match="name"):
        register_task("", ToyClassificationTask)


@pytest.mark.parametrize("training", [True, False])
def test_evaluating_is_eval_mode_without_grad_and_restores_the_flag(training):
    model = torch.nn.Linear(3, 2).train(training)
    with evaluating(model) as device:
        assert device == torch.device("cpu")
        assert not model.training and not torch.is_grad_enabled()
        assert not model(torch.ones(1, 3)).requires_grad
    assert model.training is training
    with pytest.raises(RuntimeError, match="boom"), evaluating(model):
        raise RuntimeError("boom")
    assert model.training is training and torch.is_grad_enabled()
