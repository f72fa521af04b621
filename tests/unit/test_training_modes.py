"""capture.modes.training_modes: one forward serves both training modes when they capture one
computation; a recurrent layer's train flag counts only where it switches dropout on."""
import torch
import torch.nn as nn

from kernelwright.capture.modes import training_modes
from kernelwright.problem import from_module


class Recurrent(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.gru = nn.GRU(8, 16, num_layers=2, batch_first=True, dropout=dropout)

    def forward(self, x):
        return self.gru(x)[0]


def _modes(model, x):
    sensitive, modes, _, _ = training_modes(from_module(model, [x], "m"), "both")
    return sensitive, modes


def test_a_recurrent_layer_without_dropout_is_one_forward_for_both_modes():
    x = torch.randn(2, 5, 8)
    assert _modes(Recurrent(0.0), x) == (["gru"], ["any"])
    assert _modes(Recurrent(0.25), x) == (["gru"], ["train", "eval"])  # dropout between the layers in train()


def test_a_batch_norm_still_gets_a_forward_per_mode():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    assert _modes(model, torch.randn(2, 3, 8, 8))[1] == ["train", "eval"]


def test_a_forward_hook_that_reads_the_mode_makes_its_module_mode_dependent():
    """The old-style spectral norm is a forward pre-hook (a callable object) that runs its power
    iteration, updating buffers, in training mode only: its module gets a forward per mode. A
    hook function is read like a class."""
    model = nn.Sequential(nn.utils.spectral_norm(nn.Linear(4, 4)), nn.Linear(4, 2))

    def scale_in_training(module, args):
        return (args[0] * 2,) if module.training else args

    model[1].register_forward_pre_hook(scale_in_training)
    sensitive, modes = _modes(model, torch.randn(3, 4))
    assert sensitive == ["0", "1"] and modes == ["train", "eval"]
    assert _modes(nn.Sequential(nn.Linear(4, 4)), torch.randn(3, 4)) == ([], ["any"])
