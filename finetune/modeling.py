"""The classifier: a checkpoint loaded with a head for the task's labels (or one output for regression).

Two heads (``model.pooling``):
- ``cls``: transformers' ``BertForSequenceClassification`` (and its kin): dropout and a linear layer on the pooler,
  a tanh projection of the [CLS] vector, as in BERT (Devlin et al. 2019).
- ``mean``: ``BertForMeanPooledClassification`` below: dropout and a linear layer on the mean of the last hidden
  states over the real tokens. Sentence-transformers checkpoints such as all-MiniLM-L6-v2 were trained as
  mean-pooled encoders (their ``1_Pooling/config.json``): their pooler and [CLS] vector were never trained, and
  in all-MiniLM-L6-v2 the pooler is still at its random initialisation (Reimers & Gurevych 2019,
  https://arxiv.org/abs/1908.10084).

Importing this module registers the ``mean`` head with transformers' Auto classes (model type
``bert_mean_pooled``), so ``AutoModelForSequenceClassification.from_pretrained`` and
``pipeline("text-classification", model="models/finetuned")`` load such a model once ``finetune.modeling`` is
imported; no remote code is involved.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, BertConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.models.bert.modeling_bert import BertModel, BertPreTrainedModel

from finetune.errors import CheckpointError
from finetune.sources import check_checkpoint
from finetune.tasks import Task


class MeanPooledBertConfig(BertConfig):
    """``BertConfig`` of a model with the mean-pooling head (its own model type, so the Auto classes find it)."""

    model_type = "bert_mean_pooled"


class BertForMeanPooledClassification(BertPreTrainedModel):
    """BERT with a classification (or regression) head on the masked mean of its last hidden states.

    Weights: ``bert.*`` (a ``BertModel`` without pooler, loaded from any BERT checkpoint) and ``classifier.*``
    (``Linear(hidden_size, num_labels)``, new). Loss as ``BertForSequenceClassification``: cross-entropy, or mean
    squared error when ``config.problem_type == "regression"``.
    """

    config_class = MeanPooledBertConfig

    def __init__(self, config: MeanPooledBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = torch.nn.Dropout(dropout)
        self.classifier = torch.nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                **kwargs) -> SequenceClassifierOutput:
        """Logits ``[batch, num_labels]`` of token ids ``[batch, seq_len]``; the loss too when ``labels [batch]``
        are given. Padding (``attention_mask`` 0) is left out of the mean."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           return_dict=True, **kwargs).last_hidden_state  # [batch, seq_len, hidden]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [batch, seq_len, 1]
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # [batch, hidden]
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            if self.config.problem_type == "regression":
                loss = torch.nn.functional.mse_loss(logits[:, 0], labels.to(logits.dtype))
            else:
                loss = torch.nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


AutoConfig.register(MeanPooledBertConfig.model_type, MeanPooledBertConfig)
AutoModelForSequenceClassification.register(MeanPooledBertConfig, BertForMeanPooledClassification)


def _bert_settings(config) -> dict:
    """A BERT config's settings without its model type and architectures, to build a config of another type."""
    return {k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures")}


def load_classifier(checkpoint_dir: str | Path, task: Task, pooling: str = "cls") -> PreTrainedModel:
    """Load a sequence classifier for ``task`` from a local checkpoint folder, with a new head.

    The config gets the task's ``num_labels`` (1 for regression), ``id2label`` / ``label2id`` (the class names, so
    ``pipeline("text-classification")`` prints them) and ``problem_type`` (MSE loss for regression,
    cross-entropy otherwise). The pipeline's ``models/pretrained`` holds an encoder only (the download stage drops
    any head, ``load_encoder``), so the head is freshly initialised, seeded by the caller's ``set_seed``; a folder
    with a head of another size (e.g. an MNLI model's 3 outputs) gets a new one too (``ignore_mismatched_sizes``).

    ``pooling`` (``model.pooling``) picks the head: ``cls`` (the checkpoint's architecture, e.g.
    ``BertForSequenceClassification``) or ``mean`` (``BertForMeanPooledClassification``, BERT checkpoints only).

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer (``check_checkpoint``), or ``pooling`` is
            ``mean`` and the checkpoint is not a BERT model.
    """
    check_checkpoint(checkpoint_dir)
    config = AutoConfig.from_pretrained(checkpoint_dir)
    head = {"num_labels": task.num_labels, "id2label": task.id2label,
            "label2id": {name: i for i, name in task.id2label.items()},
            "problem_type": "regression" if task.is_regression else "single_label_classification"}
    if pooling == "cls":
        return AutoModelForSequenceClassification.from_pretrained(checkpoint_dir, ignore_mismatched_sizes=True, **head)
    if config.model_type not in ("bert", MeanPooledBertConfig.model_type):
        raise CheckpointError(f"{checkpoint_dir}: model.pooling: mean needs a BERT checkpoint, this one is a "
                              f"{config.model_type!r} model; use model.pooling: cls")
    mean_config = MeanPooledBertConfig(**{**_bert_settings(config), **head})
    return BertForMeanPooledClassification.from_pretrained(checkpoint_dir, config=mean_config,
                                                           ignore_mismatched_sizes=True)


def load_encoder(checkpoint_dir: str | Path) -> PreTrainedModel:
    """The encoder of a local checkpoint, without its task head: what the download stage saves as
    ``models/pretrained``, so that any checkpoint, a model fine-tuned by this pipeline included (intermediate
    training, STILTs), starts the next run the same way.

    A ``bert_mean_pooled`` model (``model.pooling: mean``) becomes a plain ``BertModel`` without a pooler, so the next
    run may use either head.

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer.
    """
    check_checkpoint(checkpoint_dir)
    config = AutoConfig.from_pretrained(checkpoint_dir)
    if config.model_type != MeanPooledBertConfig.model_type:
        return AutoModel.from_pretrained(checkpoint_dir)
    return BertModel.from_pretrained(checkpoint_dir, config=BertConfig(**_bert_settings(config)),
                                     add_pooling_layer=False)


def load_finetuned(model_dir: str | Path) -> PreTrainedModel:
    """A fine-tuned model saved by the train stage (either head: ``model.pooling`` cls or mean), for evaluation.

    Its ``config.swap_pairs`` says whether it was trained on both orders of its pairs (``train.swap_pairs``).

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer.
    """
    check_checkpoint(model_dir)
    return AutoModelForSequenceClassification.from_pretrained(model_dir)


def trained_on_both_orders(model: PreTrainedModel) -> bool:
    """Whether ``model`` (unwrapped: read it before ``accelerator.prepare``) was trained with ``train.swap_pairs``,
    so that its predictions average both orders of each pair (``finetune.evaluation.average_orders``)."""
    return bool(getattr(model.config, "swap_pairs", False))
