"""Any encoder family, both heads. A tiny random model of each family of ``FAMILIES`` (tests/helpers.py: BERT,
RoBERTa, DistilBERT, ELECTRA, DeBERTa-v2, MPNet, ModernBERT, EuroBERT, GTE, NomicBERT, Jina Embeddings v3) with a real
tokenizer of the family's class, trained here on MRPC sentences, goes through tokenize, train, evaluate, save,
``pipeline("text-classification")``, ``tools.predict`` and reuse as the next run's checkpoint (intermediate
training), with the ``cls`` and the ``mean`` head. tests/test_export.py exports each."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer, pipeline

from finetune.data.batches import make_collator
from finetune.data.collate_check import check_all
from finetune.data.download import download_checkpoint
from finetune.errors import CheckpointError
from finetune.evaluate.predictions import evaluate_model
from finetune.modeling import MeanPooledForSequenceClassification, encoder_class, load_classifier
from finetune.tasks import glue_task
from finetune.train.recipe import train
from tests.helpers import FAMILIES, make_family_checkpoint, make_project, make_raw, reset_accelerate, tiny_params
from tools.predict import predict

MRPC = glue_task("mrpc")
TOKEN_TYPES = {"bert", "electra", "deberta-v2", "nomic_bert"}  # the families whose tokenizer gives token_type_ids
NO_TOKEN_TYPE_INPUT = {"distilbert", "mpnet", "modernbert", "eurobert"}  # their encoder takes no token_type_ids
# The cls head's modules outside the encoder, and the families whose cls head adds a pooler (dense + tanh on the first
# token) inside the encoder that their bare encoder lacks (GteModel and NomicBertModel have none by default).
HEADS = {"bert": ["classifier"], "roberta": ["classifier.dense", "classifier.out_proj"],
         "distilbert": ["pre_classifier", "classifier"], "electra": ["classifier.dense", "classifier.out_proj"],
         "deberta-v2": ["pooler.dense", "classifier"], "mpnet": ["classifier.dense", "classifier.out_proj"],
         "modernbert": ["head.dense", "head.norm", "classifier"], "eurobert": ["dense", "classifier"],
         "gte": ["classifier"], "nomic_bert": ["classifier"],
         "jina_embeddings_v3": ["classifier.dense", "classifier.out_proj"]}
NEW_POOLER = {"gte", "nomic_bert"}
POOLINGS = ["cls", "mean"]


@pytest.fixture(scope="session")
def family_checkpoint(tmp_path_factory):
    """A function: family -> the folder of its tiny random encoder and tokenizer, built once per session."""
    built = {}

    def get(family: str):
        if family not in built:
            built[family] = make_family_checkpoint(tmp_path_factory.mktemp(family), family)
        return built[family]

    return get


@pytest.fixture(scope="module")
def small_raw():
    """16 train, 8 validation and 8 test sentence pairs."""
    return make_raw(train=16, validation=8, test=8)


def _batch(tokenizer) -> dict:
    """Three pairs of different lengths, collated as in training (padded)."""
    pairs = [("The court rejected the appeal.", "The appeal was rejected."),
             ("Shares fell.", "The company reported higher profits on Tuesday."),
             ("Police arrested two men.", "Two men were arrested by police.")]
    return make_collator(tokenizer)([tokenizer(s1, s2) for s1, s2 in pairs])


def _encoder_prefix(model) -> str:
    return model.base_model_prefix + "."


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokenizer_is_the_familys(family_checkpoint, family):
    tokenizer = AutoTokenizer.from_pretrained(family_checkpoint(family))
    assert type(tokenizer) is getattr(transformers, FAMILIES[family]["tokenizer"])
    encoded = tokenizer("The court rejected the appeal.", "The appeal was rejected.")
    assert ("token_type_ids" in encoded) is (family in TOKEN_TYPES)
    first, last = tokenizer.cls_token_id or tokenizer.bos_token_id, tokenizer.sep_token_id or tokenizer.eos_token_id
    assert encoded["input_ids"][0] == first and encoded["input_ids"][-1] == last  # EuroBERT: Llama 3's bos, eos
    assert tokenizer.unk_token_id not in encoded["input_ids"]  # a vocabulary of MRPC's words


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("family", FAMILIES)
def test_both_heads_start_from_every_encoder_weight(family_checkpoint, family, pooling):
    folder = family_checkpoint(family)
    encoder = AutoModel.from_pretrained(folder).state_dict()
    model = load_classifier(folder, MRPC, pooling).eval()
    prefix = _encoder_prefix(model)
    loaded = {name.removeprefix(prefix): w for name, w in model.state_dict().items() if name.startswith(prefix)}
    assert {name for name in encoder if not name.startswith("pooler.")} <= set(loaded)
    assert not (pooling == "mean" and any(name.startswith("pooler.") for name in loaded))  # mean: no pooler
    new_pooler = {"pooler.dense.weight", "pooler.dense.bias"} if pooling == "cls" and family in NEW_POOLER else set()
    assert set(loaded) - set(encoder) == new_pooler
    assert all(torch.equal(w, encoder[name]) for name, w in loaded.items() if name in encoder)  # none left random
    head = {name.rsplit(".", 1)[0] for name, _ in model.named_parameters() if not name.startswith(prefix)}
    assert head == set(HEADS[family] if pooling == "cls" else ["classifier"])
    if pooling == "mean":  # dropout + linear on the masked mean; token_type_ids only to a family that takes them
        assert isinstance(model, MeanPooledForSequenceClassification) and model.config.encoder.model_type == family
        batch = _batch(AutoTokenizer.from_pretrained(folder))
        with torch.no_grad():
            logits = model(**batch).logits
            inputs = {k: v for k, v in batch.items() if k != "token_type_ids" or model.takes_token_type_ids}
            hidden = model.base_model(**inputs).last_hidden_state  # [batch, seq_len, hidden]
            mask = batch["attention_mask"].unsqueeze(-1).float()
            torch.testing.assert_close(logits, model.classifier((hidden * mask).sum(1) / mask.sum(1)))
            types = {"token_type_ids": torch.ones_like(batch["input_ids"])}
            changed = model(**{**batch, **types}).logits if family in NO_TOKEN_TYPE_INPUT else logits
        assert model.takes_token_type_ids is (family not in NO_TOKEN_TYPE_INPUT)
        torch.testing.assert_close(changed, logits)  # given anyway, they are left out


def test_a_model_type_without_an_encoder_class_is_named():
    from transformers import PreTrainedConfig

    class NoEncoderConfig(PreTrainedConfig):
        model_type = "no_encoder"

    with pytest.raises(CheckpointError, match="model type 'no_encoder' has no encoder"):
        encoder_class(NoEncoderConfig())


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_trains_evaluates_predicts_and_is_reused(family_checkpoint, small_raw, tmp_path, family, pooling):
    # the pipeline's own tokenize (make_project runs the tokenize stage's tokenize_splits), batch checks, training
    # loop, evaluation and saving
    params = tiny_params(model={"pooling": pooling}, train={"max_steps": 2})
    paths = make_project(tmp_path / "first", params, small_raw, family_checkpoint(family))
    assert check_all(params, paths)["forward"]["logits_shape"][1] == 2
    assert train(params, paths)["steps"] == 2
    reset_accelerate()
    results = evaluate_model(params, paths)
    assert set(results) == {"validation", "test"} and 0 <= results["validation"]["accuracy"] <= 1
    config = json.loads((paths.trained / "config.json").read_text())
    assert (config["model_type"], config.get("encoder", {}).get("model_type")) == \
        ((family, None) if pooling == "cls" else ("mean_pooled", family))
    # the saved folder as it is: transformers' pipeline, tools.predict
    classify = pipeline("text-classification", model=str(paths.trained))
    [result] = classify([{"text": "The court rejected the appeal.", "text_pair": "The appeal was rejected."}])
    assert result["label"] in MRPC.label_names
    new = tmp_path / "new.csv"
    small_raw["validation"].to_pandas()[["sentence1", "sentence2"]].to_csv(new, index=False)
    scored, evaluated = predict(new, paths.trained, batch_size=4), pd.read_csv(paths.predictions / "validation.csv")
    np.testing.assert_allclose(scored["probability_equivalent"], evaluated["probability_equivalent"], atol=2e-5)
    # intermediate training: the download stage keeps the encoder, the next run gets a new head for its task
    trained_model = AutoModelForSequenceClassification.from_pretrained(paths.trained)
    prefix, trained = _encoder_prefix(trained_model), trained_model.state_dict()
    pretrained = tmp_path / "second" / "models" / "pretrained"
    assert download_checkpoint(str(paths.trained), pretrained)["model_type"] == family
    # the weights the folder holds, as the model names them (GTE's and NomicBERT's files keep their original names)
    bare, info = AutoModel.from_pretrained(pretrained, output_loading_info=True)
    encoder = {name: w for name, w in bare.state_dict().items() if name not in info["missing_keys"]}
    dropped = {name for name in trained if name.startswith(prefix + "pooler.")} if family in NEW_POOLER else set()
    assert {prefix + name for name in encoder} >= {name for name in trained if name.startswith(prefix)} - dropped
    assert all(torch.equal(w, trained[prefix + name]) for name, w in encoder.items() if prefix + name in trained)
    for next_pooling in POOLINGS:
        model = load_classifier(pretrained, glue_task("rte"), pooling=next_pooling)
        weights = model.state_dict()
        assert all(torch.equal(weights[prefix + name], w) for name, w in encoder.items() if prefix + name in weights)
        head = [name for name in weights if not name.startswith(prefix) and name.endswith("weight")]
        assert head and not any(name in trained and torch.equal(weights[name], trained[name]) for name in head)
