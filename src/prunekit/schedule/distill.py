"""Recovery by knowledge distillation: a pruned student learns the dense teacher's outputs.

``distillation_loss`` is the KL divergence from the teacher's softened distribution to the
student's, scaled by temperature² so its gradients keep their size across temperatures
(Hinton et al., 2015); over token sequences it averages the positions an attention mask
keeps. ``hidden_state_loss`` is the mean squared error of pairs of hidden states.
``Distiller`` holds the teacher and turns a student's output and its inputs into the loss,
for a plain loop, Lightning's ``training_step`` or ``prunekit.schedule.hf_callback``'s
``DistillationTrainer``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from prunekit.core.checks import check_number
from prunekit.core.errors import type_error, value_error
from prunekit.core.example_inputs import named

__all__ = ["Distiller", "Inputs", "Output", "distillation_loss", "hidden_state_loss"]

Inputs = Tensor | tuple[object, ...] | list[object] | Mapping[str, object]
"""A batch as a model's forward takes it: one tensor, positional arguments or keywords."""

Output = object
"""A model's output as its forward returns it: logits, or an object or mapping holding
``logits`` (and ``loss``, ``hidden_states``)."""


def distillation_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    *,
    temperature: float = 2.0,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """temperature² x KL(softmax(teacher / T) || softmax(student / T)), averaged.

    Args:
        student_logits: (..., classes); gradients flow into it.
        teacher_logits: the same shape; detached (no gradient reaches the teacher).
        temperature: T > 0; higher softens both distributions.
        attention_mask: (...) without the class dim, such as (batch, tokens): the positions
            whose 0 entries are left out of the average (padding).

    Returns:
        A scalar (float32 at least): 0 when the logits are equal.

    Raises:
        ValueError: shapes that differ, a temperature that is not finite and > 0, a mask of
            another shape, with an entry negative or not finite, or that keeps no position.
        TypeError: logits or a mask that are no tensors, a temperature that is no real
            number (a bool included).
    """
    _check_temperature(temperature, "distillation_loss")
    for name, value in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not isinstance(value, Tensor) or value.dim() < 1:
            raise type_error(
                f"distillation_loss: invalid {name} of type {type(value).__name__}; expected a "
                "tensor of logits (..., classes)"
            )
    if student_logits.shape != teacher_logits.shape:
        raise value_error(
            f"distillation_loss: student_logits of shape {tuple(student_logits.shape)} and "
            f"teacher_logits of shape {tuple(teacher_logits.shape)}; expected one shape"
        )
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    log_student = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    log_teacher = F.log_softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)
    teacher_p = log_teacher.exp()
    # 0 x log 0 = 0: a class the teacher rules out (a logit of -inf) adds nothing, even
    # where the student rules it out too (where keeps NaN out of the gradient as well);
    # a NaN of the teacher's is no such class: it makes the loss NaN (`!= 0`, not `> 0`)
    terms = torch.where(teacher_p != 0, teacher_p * (log_teacher - log_student), 0.0)
    per_position = terms.sum(-1)
    of = "the logits' shape without the class dim"
    return _mean(per_position, attention_mask, "distillation_loss", of) * temperature**2


def hidden_state_loss(
    student_states: Sequence[Tensor],
    teacher_states: Sequence[Tensor],
    *,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Mean over pairs of the mean squared error of a student's hidden state to the teacher's.

    Args:
        student_states: hidden states (batch, tokens, width) or any shape, one per pair.
        teacher_states: as many, each of its pair's shape; detached. A pruned hidden width
            makes the student's narrower: pair it through your own projection first.
        attention_mask: (batch, tokens): positions to leave out where 0.

    Raises:
        ValueError: pair counts or shapes that differ, or no pair.
    """
    student_states, teacher_states = list(student_states), list(teacher_states)
    if not student_states or len(student_states) != len(teacher_states):
        raise value_error(
            f"hidden_state_loss: {len(student_states)} student and {len(teacher_states)} "
            "teacher states; expected as many of each, at least one"
        )
    total: Tensor | None = None
    for k, (s, t) in enumerate(zip(student_states, teacher_states, strict=True)):
        if not isinstance(s, Tensor) or not isinstance(t, Tensor) or s.shape != t.shape:
            shapes = [tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__ for x in (s, t)]
            raise value_error(
                f"hidden_state_loss: pair {k} has student {shapes[0]} and teacher "
                f"{shapes[1]}; expected tensors of one shape"
            )
        dtype = torch.promote_types(s.dtype, torch.float32)
        squared = (s.to(dtype) - t.detach().to(dtype)).square()
        per_position = squared.mean(-1) if attention_mask is not None else squared
        of = "the states' shape without their last dim"
        term = _mean(per_position, attention_mask, "hidden_state_loss", of)
        total = term if total is None else total + term
    assert total is not None
    return total / len(student_states)


class Distiller:
    """The dense teacher, and how its outputs make a pruned student's loss.

    ``distiller.loss(student_output, inputs)`` runs the teacher on `inputs` (without
    gradients, in eval mode, its mode restored) and returns
    ``alpha x distillation_loss + (1 - alpha) x student_output.loss`` (+ `logit_weight` x the
    mean squared error of the logits, + `hidden_weight` x ``hidden_state_loss`` over the
    hidden states of both). `inputs` are what the student's forward took: a tensor, a tuple
    of positional arguments or a dict of keyword arguments (its ``labels`` are not passed to
    the teacher; its ``attention_mask``, a tuple's by the place the forward names it, masks
    the average over tokens). An encoder-decoder
    (a Hugging Face model that derives its decoder's inputs from ``labels``, such as BART
    or T5) gets those decoder inputs instead of the labels, and its logits are averaged
    over the target's positions: ``decoder_attention_mask``, else the labels that are not
    -100 (its ``attention_mask`` is the source's). Logits are the
    output itself when it is a tensor, else its ``logits`` (an attribute, or a key of a dict
    output; so are ``loss`` and ``hidden_states``). The teacher is moved to the device of
    the student's logits when they differ.

    Args:
        teacher: the model before pruning (a copy: ``copy.deepcopy(model)`` before
            ``prune_channels``).
        temperature: softens both distributions; the loss is scaled by its square.
        alpha: weight of the distillation term in [0, 1]; below 1 the student's output
            must carry its own ``loss`` (a Hugging Face model given ``labels``).
        logit_weight: weight >= 0 of the logits' mean squared error (over classes, then
            over positions as the KL term averages them): it matches the logits
            themselves, where the KL term sees only their softmax (blind to a shift shared
            by all classes, nearly blind to the improbable ones).
        hidden_weight: weight >= 0 of the hidden-state term; above 0 both forwards return
            ``hidden_states`` (the teacher is called with ``output_hidden_states=True``;
            call the student so too) of the same shapes (an encoder-decoder's output holds
            none: 0 for it).

    Raises:
        TypeError: a teacher that is no nn.Module; a temperature, alpha or weight that is
            no real number (a bool included).
        ValueError: a temperature that is not finite and > 0, an alpha outside [0, 1], a
            weight that is negative or not finite.
    """

    def __init__(
        self,
        teacher: nn.Module,
        *,
        temperature: float = 2.0,
        alpha: float = 1.0,
        logit_weight: float = 0.0,
        hidden_weight: float = 0.0,
    ) -> None:
        if not isinstance(teacher, nn.Module):
            raise type_error(
                f"Distiller: invalid teacher of type {type(teacher).__name__}; expected the "
                "dense torch.nn.Module"
            )
        _check_temperature(temperature, "Distiller")
        check_number(alpha, "alpha", "Distiller", "a float in [0, 1]", lambda v: 0 <= v <= 1)
        for name, weight in (("logit_weight", logit_weight), ("hidden_weight", hidden_weight)):
            check_number(weight, name, "Distiller", "a finite float >= 0", _finite_nonnegative)
        self.teacher = teacher
        self.logit_weight = float(logit_weight)
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self.hidden_weight = float(hidden_weight)

    def teacher_output(self, inputs: Inputs, device: torch.device | None = None) -> Output:
        """The teacher's output on `inputs` (no gradients, eval mode).

        Args:
            inputs: a batch as the student takes it: a tensor, a tuple of positional
                arguments or a mapping of keyword ones (``labels`` is left out; an
                encoder-decoder gets the decoder inputs it derives from them).
            device: where the teacher runs; it is moved there first if it is elsewhere.
                None: where it is.

        Returns:
            The teacher's output, as its forward returns it (with the hidden states when
            ``hidden_weight`` is set); the teacher's modes are put back afterwards.

        Raises:
            TypeError: `inputs` of another kind.
        """
        args, kwargs = _split(inputs)
        without_labels(self.teacher, kwargs)
        if self.hidden_weight:
            kwargs["output_hidden_states"] = True
        first = next(self.teacher.parameters(), None)
        if device is not None and first is not None and first.device != device:
            self.teacher.to(device)
        modes = [(module, module.training) for module in self.teacher.modules()]
        self.teacher.eval()
        try:
            with torch.no_grad():
                found: Output = self.teacher(*args, **kwargs)
                return found
        finally:
            for module, mode in modes:  # each its own: a frozen norm stays in eval mode
                module.training = mode

    def loss(
        self, student_output: Output, inputs: Inputs, *, teacher_output: Output | None = None
    ) -> Tensor:
        """The student's loss for `student_output`, its output on `inputs`.

        Args:
            student_output: the student's output on `inputs` (logits, or an output with
                ``logits``).
            inputs: what the student's forward took (see the class); its
                ``attention_mask`` masks the averages.
            teacher_output: the teacher's output on the same `inputs` when it is already
                at hand (logits computed once and reused every epoch: offline
                distillation); the teacher is then not run. It is detached, and with
                `hidden_weight` it must carry ``hidden_states``.

        Returns:
            A scalar: 0 when the student's outputs equal the teacher's.

        Raises:
            TypeError: an output without logits, `inputs` of another kind.
            ValueError: logits of another shape than the teacher's; `alpha` < 1 and no
                ``loss`` in `student_output`; `hidden_weight` and no hidden states.
        """
        student = _logits(student_output, "student")
        if teacher_output is None:
            teacher_output = self.teacher_output(inputs, student.device)
        _split(inputs)  # refuses inputs of another kind
        keywords = _keywords(inputs, self.teacher)
        given = keywords.get("attention_mask")
        given = given if isinstance(given, Tensor) else None
        mask = given if student.dim() == 3 else None  # logits over tokens
        if _field(student_output, "encoder_last_hidden_state") is not None:
            mask = _target_mask(keywords)  # an encoder-decoder's logits are the target's
        teacher = _logits(teacher_output, "teacher")
        total = self.alpha * distillation_loss(
            student, teacher, temperature=self.temperature, attention_mask=mask
        )
        if self.logit_weight:
            total = total + self.logit_weight * hidden_state_loss(
                [student], [teacher], attention_mask=mask
            )
        if self.alpha < 1:
            total = total + (1 - self.alpha) * self._own_loss(student_output)
        if self.hidden_weight:
            total = total + self.hidden_weight * self._hidden_term(
                student_output, teacher_output, given
            )
        return total

    def _own_loss(self, student_output: Output) -> Tensor:
        """The student's own ``loss`` (mixed in where `alpha` < 1)."""
        own = _field(student_output, "loss")
        if not isinstance(own, Tensor):
            raise value_error(
                f"Distiller: alpha={self.alpha} mixes in the student's own loss, but its "
                "output has no `loss`; expected a model given labels, or alpha=1.0"
            )
        return own

    def _hidden_term(
        self, student_output: Output, teacher_output: Output, given: Tensor | None
    ) -> Tensor:
        """``hidden_state_loss`` over both outputs' hidden states."""
        states = [_field(o, "hidden_states") for o in (student_output, teacher_output)]
        if states[0] is None and _field(student_output, "decoder_hidden_states") is not None:
            raise value_error(
                f"Distiller: hidden_weight={self.hidden_weight} compares hidden_states, but "
                "the student is an encoder-decoder, whose output holds encoder_hidden_states "
                "and decoder_hidden_states instead; expected hidden_weight=0 for an "
                "encoder-decoder (its logits are distilled)"
            )
        for found, whose, expected in (
            (
                states[0],
                "the student's output",
                "the student called with output_hidden_states=True",
            ),
            (states[1], "the teacher_output given", "the teacher's output with hidden_states"),
        ):
            if found is None:
                raise value_error(
                    f"Distiller: hidden_weight={self.hidden_weight} compares hidden states, "
                    f"but {whose} has none; expected {expected}"
                )
        # hidden states over tokens are masked even where the logits are not (a
        # classifier's logits are per sequence, its hidden states per token)
        over_tokens = all(isinstance(s, Tensor) and s.dim() == 3 for s in states[0])
        return hidden_state_loss(
            states[0], states[1], attention_mask=given if over_tokens else None
        )

    def __repr__(self) -> str:
        return (
            f"Distiller({type(self.teacher).__name__}, temperature={self.temperature:g}, "
            f"alpha={self.alpha:g}, logit_weight={self.logit_weight:g}, "
            f"hidden_weight={self.hidden_weight:g})"
        )


def _check_temperature(temperature: Any, owner: str) -> None:
    check_number(temperature, "temperature", owner, "a finite float > 0", _finite_positive)


def _finite_positive(value: float) -> bool:
    return 0 < value < math.inf


def _finite_nonnegative(value: float) -> bool:
    return 0 <= value < math.inf


def _mean(values: Tensor, mask: Tensor | None, owner: str, of: str) -> Tensor:
    """The mean of `values`, over the positions `mask` keeps (of `values`' shape: `of`)."""
    if mask is None:
        return values.mean()
    if not isinstance(mask, Tensor) or mask.shape != values.shape:
        found = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise value_error(
            f"{owner}: attention_mask of shape {found}; expected {tuple(values.shape)}, {of}"
        )
    weights = mask.to(device=values.device, dtype=values.dtype)
    bad = ~torch.isfinite(weights) | (weights < 0)
    if bool(bad.any()):
        raise value_error(
            f"{owner}: attention_mask holds {float(weights[bad][0]):g}; expected 1s (kept) "
            "and 0s (left out)"
        )
    kept = weights.sum()
    if float(kept) <= 0:
        raise value_error(f"{owner}: attention_mask keeps no position; expected some 1s")
    return (values * weights).sum() / kept


def _field(output: Any, name: str) -> Any:
    """``output.<name>``, or ``output[name]`` of a dict output (None when absent)."""
    if isinstance(output, Mapping):
        return output.get(name)
    return getattr(output, name, None)


def _logits(output: Any, whose: str) -> Tensor:
    found = output if isinstance(output, Tensor) else _field(output, "logits")
    if not isinstance(found, Tensor):
        raise type_error(
            f"Distiller: the {whose}'s output is {type(output).__name__}, with no logits; "
            "expected a tensor of logits or an output with `.logits`"
        )
    return found


def without_labels(model: nn.Module, kwargs: dict[str, Any]) -> None:
    """Take ``labels`` out of the keyword arguments of `model`'s forward (in place). An
    encoder-decoder (a Hugging Face model that derives its decoder's inputs from its
    labels) gets those decoder inputs instead, as it would make them itself: without
    them it would decode the shifted source, not the target its student decodes."""
    labels = kwargs.pop("labels", None)
    derive = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    config = getattr(model, "config", None)
    given = "decoder_input_ids" in kwargs or "decoder_inputs_embeds" in kwargs
    if (
        isinstance(labels, Tensor)
        and callable(derive)
        and getattr(config, "is_encoder_decoder", False)
        and not given
    ):
        kwargs["decoder_input_ids"] = derive(labels=labels)


def _keywords(inputs: Inputs, model: nn.Module) -> dict[str, Any]:
    """`inputs` by the names of `model`'s forward: a mapping's own, a tuple's items by the
    parameters they fill (``core.example_inputs.named``; the teacher's forward, which takes
    what the student's does); a tensor names nothing."""
    found = named(inputs, model)
    return dict(found) if isinstance(found, Mapping) else {}


def _target_mask(kwargs: Mapping[str, Any]) -> Tensor | None:
    """The positions of an encoder-decoder's logits to average: its
    ``decoder_attention_mask``, else the ``labels`` not -100 (what its own loss leaves
    out), else all of them (None), from `kwargs` (the inputs by name, ``_keywords``); its
    ``attention_mask`` is the source's."""
    mask = kwargs.get("decoder_attention_mask")
    if isinstance(mask, Tensor):
        return mask
    labels = kwargs.get("labels")
    return labels.ne(-100) if isinstance(labels, Tensor) else None


def _split(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, Tensor):
        return (inputs,), {}
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, tuple | list):
        return tuple(inputs), {}
    raise type_error(
        f"Distiller: inputs of type {type(inputs).__name__}; expected a tensor, a tuple of "
        "positional arguments or a dict of keyword arguments"
    )
