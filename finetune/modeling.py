"""The classifier of a checkpoint of any encoder family with the task's head: ``cls``, the family's own
``*ForSequenceClassification`` on the first token, or ``mean``, ``MeanPooledForSequenceClassification`` on the masked
mean of the last hidden states (as sentence-transformers checkpoints were trained: https://arxiv.org/abs/1908.10084).
Importing the module registers the ``mean_pooled`` model type with transformers' Auto classes.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.configuration_utils import SubConfigSpec
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.models.auto.modeling_auto import MODEL_MAPPING

from finetune.checkpoint_files import check_checkpoint_files, damaged
from finetune.errors import CheckpointError
from finetune.tasks import Task


class MeanPooledConfig(PreTrainedConfig):
    """Config of ``MeanPooledForSequenceClassification``: the task's labels and ``encoder``, the encoder's own
    config (e.g. a ``RobertaConfig``)."""

    model_type = "mean_pooled"
    sub_configs_defaults = {"encoder": SubConfigSpec(config_class=AutoConfig, model_type="bert")}

    encoder: PreTrainedConfig | dict | None = None


def encoder_class(config: PreTrainedConfig) -> type[PreTrainedModel]:
    """The ``AutoModel`` class (the bare encoder) of an encoder config, e.g. ``RobertaModel`` of a ``RobertaConfig``.

    Raises:
        CheckpointError: transformers has no bare model of that type.
    """
    try:
        return MODEL_MAPPING[type(config)]
    except KeyError:
        raise CheckpointError(f"model type {config.model_type!r} has no encoder (AutoModel) class in transformers; "
                              "use a checkpoint of an encoder family such as BERT, RoBERTa or MPNet") from None


def _head_dropout(config: PreTrainedConfig) -> float:
    """The dropout before the head: the family's own classifier dropout if it sets one, else its hidden dropout
    (``classifier_dropout``, DeBERTa's ``cls_dropout``, DistilBERT's ``seq_classif_dropout``, ``hidden_dropout_prob``,
    DistilBERT's ``dropout``; 0.1 when it has none)."""
    for name in ("classifier_dropout", "cls_dropout", "seq_classif_dropout", "hidden_dropout_prob", "dropout"):
        if getattr(config, name, None) is not None:
            return getattr(config, name)
    return 0.1


class MeanPooledForSequenceClassification(PreTrainedModel):
    """Any encoder with a classification (or regression) head on the masked mean of its last hidden states.

    Weights: the encoder without a pooler under the family's own prefix (``bert.*``, ``roberta.*``, ...), and
    ``classifier.*`` (``Linear(hidden_size, num_labels)``). Loss: cross-entropy, or MSE for "regression".
    """

    config_class = MeanPooledConfig
    base_model_prefix = "encoder"  # replaced per instance by the family's prefix
    _supports_flash_attn = True  # the encoder decides: the head has no attention of its own
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True

    def __init__(self, config: MeanPooledConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        family = encoder_class(config.encoder)
        no_pooler = {"add_pooling_layer": False} if "add_pooling_layer" in inspect.signature(family).parameters else {}
        self.base_model_prefix = family.base_model_prefix
        setattr(self, self.base_model_prefix, AutoModel.from_config(config.encoder, **no_pooler))
        # the model's config is the shared one, so that config changes (attention implementation) reach the encoder
        config.encoder = self.base_model.config
        self.takes_token_type_ids = "token_type_ids" in inspect.signature(self.base_model.forward).parameters
        self.dropout = torch.nn.Dropout(_head_dropout(config.encoder))
        self.classifier = torch.nn.Linear(config.encoder.hidden_size, config.num_labels)
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """The head as the family's own: normal weights (std ``initializer_range``), zero bias; the encoder's
        modules are initialised by the encoder's own ``_init_weights``."""
        if module is self.classifier:
            init.normal_(module.weight, mean=0.0, std=getattr(self.config.encoder, "initializer_range", 0.02))
            init.zeros_(module.bias)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.base_model.get_input_embeddings()

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.base_model.set_input_embeddings(value)

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                **kwargs) -> SequenceClassifierOutput:
        """``logits [batch, num_labels]``, and ``loss`` with ``labels``.

        Args:
            input_ids: ``[batch, seq_len]``.
            attention_mask: ``[batch, seq_len]``, 0 at padding, which the mean leaves out; None: no padding.
            token_type_ids: ``[batch, seq_len]``, passed on where the family takes them (not DistilBERT, MPNet).
            labels: ``[batch]`` class ids, or scores for regression.
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is not None and self.takes_token_type_ids:
            kwargs["token_type_ids"] = token_type_ids
        hidden = self.base_model(input_ids, attention_mask=attention_mask, return_dict=True,
                                 **kwargs).last_hidden_state  # [batch, seq_len, hidden]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [batch, seq_len, 1]
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # [batch, hidden]
        logits = self.classifier(self.dropout(pooled))  # [batch, num_labels]
        loss = None
        if labels is not None:
            if self.config.problem_type == "regression":
                loss = torch.nn.functional.mse_loss(logits[:, 0], labels.to(logits.dtype))
            else:
                loss = torch.nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


AutoConfig.register(MeanPooledConfig.model_type, MeanPooledConfig)
AutoModelForSequenceClassification.register(MeanPooledConfig, MeanPooledForSequenceClassification)


def load_classifier(checkpoint_dir: str | Path, task: Task, pooling: str = "cls") -> PreTrainedModel:
    """A sequence classifier for ``task`` from a ``save_pretrained`` folder of any encoder family (a bare encoder,
    the family's classifier or pretraining model, or a mean-pooled model). The head is new (seeded by the caller's
    ``set_seed``), replacing one of another size; ``pooling``: ``cls`` (the family's head) or ``mean``.

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer (``check_checkpoint``), its model type has no
            encoder class, or a weight of the encoder is not in the checkpoint (it would start from random values).
    """
    config = check_checkpoint(checkpoint_dir)
    head = {"num_labels": task.num_labels, "id2label": task.id2label,
            "label2id": {name: i for i, name in task.id2label.items()},
            "problem_type": "regression" if task.is_regression else "single_label_classification"}
    mean_pooled = config.model_type == MeanPooledConfig.model_type
    if pooling == "cls" and not mean_pooled:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            checkpoint_dir, ignore_mismatched_sizes=True, output_loading_info=True, **head)
    elif pooling == "cls":  # the encoder of a mean-pooled model, under the same prefix as in the family's classifier
        encoder_config = config.encoder
        for key, value in head.items():
            setattr(encoder_config, key, value)
        model, info = AutoModelForSequenceClassification.from_pretrained(
            checkpoint_dir, config=encoder_config, ignore_mismatched_sizes=True, output_loading_info=True)
    else:
        mean_config = MeanPooledConfig(encoder=config.encoder if mean_pooled else config, **head)
        model, info = MeanPooledForSequenceClassification.from_pretrained(
            checkpoint_dir, config=mean_config, ignore_mismatched_sizes=True, output_loading_info=True)
    _check_encoder_loaded(model, info, checkpoint_dir)
    return model


def load_encoder(checkpoint_dir: str | Path) -> PreTrainedModel:
    """The encoder of a local checkpoint without its task head (``RobertaModel`` of a
    ``RobertaForSequenceClassification``; a ``mean_pooled`` model's without a pooler).

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer, its model type has no encoder class, or a
            weight of the encoder is not in the checkpoint.
    """
    config = check_checkpoint(checkpoint_dir)
    if config.model_type == MeanPooledConfig.model_type:
        model, info = MeanPooledForSequenceClassification.from_pretrained(checkpoint_dir, output_loading_info=True)
    else:
        encoder_class(config)  # a clear error for a model type without an encoder
        model, info = AutoModel.from_pretrained(checkpoint_dir, output_loading_info=True)
    _check_encoder_loaded(model, info, checkpoint_dir)
    return model.base_model


def _check_encoder_loaded(model: PreTrainedModel, info: dict, checkpoint_dir: str | Path) -> None:
    """Every weight of ``model``'s encoder came from the checkpoint: only the head (and a pooler, which a
    checkpoint may lack) may be new.

    Raises:
        CheckpointError: naming the first missing or resized weights.
    """
    prefix = f"{model.base_model_prefix}." if model.base_model is not model else ""
    new = sorted(info["missing_keys"] | {key for key, *_ in info["mismatched_keys"]})
    encoder = [key for key in new if key.startswith(prefix) and ".pooler." not in f".{key}"]
    if encoder:
        raise CheckpointError(f"{checkpoint_dir}: {len(encoder)} weight(s) of the "
                              f"{model.base_model.config.model_type!r} encoder are not in the checkpoint or have "
                              f"another shape, e.g. {encoder[:3]}; its weights do not fit its config.json")


def load_finetuned(model_dir: str | Path, config: PreTrainedConfig | None = None) -> PreTrainedModel:
    """A fine-tuned model saved by the train stage (either head: ``model.pooling`` cls or mean), for evaluation.

    Args:
        config: the folder's config, as ``check_checkpoint`` returned it; None: the folder is checked and its
            config.json read here.

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer.
    """
    return AutoModelForSequenceClassification.from_pretrained(model_dir, config=config or check_checkpoint(model_dir))


def check_checkpoint(checkpoint_dir: str | Path, need_weights: bool = True) -> PreTrainedConfig:
    """Check a local checkpoint folder (``check_checkpoint_files``: config, weights when ``need_weights``, tokenizer,
    safetensors headers) with its config read by transformers; return that config, the one read of its config.json
    (pass it on to the loaders rather than reading the file again).

    Raises:
        CheckpointError: naming the folder and the missing files, or the file that can't be read, before
            transformers fails deep inside.
    """
    return check_checkpoint_files(checkpoint_dir, need_weights, load_config=_read_config)


def _read_config(folder: Path) -> PreTrainedConfig:
    """``AutoConfig`` of ``folder``.

    Raises:
        CheckpointError: naming config.json and transformers' error.
    """
    try:
        return AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as err:
        raise damaged(folder / "config.json", err) from None
