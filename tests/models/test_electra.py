"""ELECTRA's replaced-token detection (models/objectives/rtd.py): the generator's shape and sharing, the
sampler, the discriminator's labels, the FLOP count of both networks, and the keyed sampling noise."""

import numpy as np
import pytest
import torch

from cramlm.data.collate import MLMCollator
from cramlm.models.objectives.config import RTDConfig
from cramlm.models.objectives.rtd import ReplacedTokenDetection, build_rtd, discriminator_state, sample_tokens
from tests.models.helpers import VOCAB, random_ids, tiny_model
from tests.models.test_properties import counted_flops

SPECIAL = 5


def rtd_model(size: float = 0.5, seed: int = 0) -> ReplacedTokenDetection:
    torch.manual_seed(seed)
    return build_rtd(tiny_model("crammed-bert", seed=seed), RTDConfig(generator_size=size), SPECIAL)


def masked(ids: torch.Tensor, every: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs with [MASK] = 4 at every ``every``-th position from 1, labels there)."""
    labels = torch.full_like(ids, -100)
    labels[:, 1::every] = ids[:, 1::every]
    inputs = ids.clone()
    inputs[:, 1::every] = 4
    return inputs, labels


def test_generator_is_narrow_and_shares_the_token_embedding():
    model = rtd_model(size=0.5)
    g, d = model.generator_cfg, model.cfg
    assert (g.hidden_size, g.num_heads, g.intermediate_size, g.num_layers) == (16, 2, 32, d.num_layers)
    assert g.hidden_size // g.num_heads == d.hidden_size // d.num_heads  # heads keep their dimension
    shared = model.discriminator.tokens.weight
    assert model.generator.trunk.tokens[0].weight is shared and model.generator.tokens.weight is shared
    names = {n for n, _ in model.named_parameters()}  # each parameter once, the discriminator's name first
    assert "discriminator.trunk.tokens.weight" in names and not any(n.startswith("generator.trunk.tokens.0") for n in names)
    # the discriminator alone is the arch's model: its state loads into a fresh one, strictly
    fresh = tiny_model("crammed-bert", seed=3)
    fresh.load_state_dict(discriminator_state(model.state_dict()))
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.discriminator.state_dict().values()))
    # ELECTRA's 1/4 at cramming's base width: 3 heads of 64, FFN 768
    from cramlm.config.loader import load_preset
    from cramlm.models.config import CrammedBertConfig
    from cramlm.models.objectives.rtd import generator_config

    base = generator_config(CrammedBertConfig.model_validate(load_preset("arch", "crammed-bert")), 0.25)
    assert (base.hidden_size, base.num_heads, base.intermediate_size) == (192, 3, 768)


def test_sampler_follows_the_softmax_and_never_draws_special_ids():
    logits = torch.tensor([[9.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]).repeat(4000, 1)
    logits[:, 6] = 2.0  # among the non-special ids 5..9: p(6) = e^2 / (e^2 + 4)
    noise = torch.from_numpy(np.random.default_rng(0).random(4000))
    ids = sample_tokens(logits, noise, SPECIAL)
    assert ids.min() >= SPECIAL and ids.max() <= 9
    assert (ids == 6).float().mean() == pytest.approx(np.e**2 / (np.e**2 + 4), abs=0.03)
    assert torch.equal(ids, sample_tokens(logits, noise, SPECIAL))  # the noise decides: deterministic
    edges = sample_tokens(logits[:2], torch.tensor([0.0, 1 - 2**-53], dtype=torch.float64), SPECIAL)
    assert edges.tolist() == [5, 9]


def test_discriminator_labels_replaced_where_the_sample_differs(monkeypatch):
    """Replaced where the sample differs from the original; a sample equal to the original counts
    as original (ELECTRA); special positions are never scored; the loss is mlm + 50 x bce."""
    model = rtd_model().train()
    ids = random_ids(2, 16)
    ids[:, 0] = 2  # [CLS]: special, never scored
    inputs, labels = masked(ids)
    seen = {}

    def fixed_samples(logits, noise, num_special):  # half the masked positions get their original back
        out = torch.full((len(noise),), 7)
        originals = labels[labels != -100]
        out[::2] = originals[::2]
        return out

    def bce(z, target):
        seen["target"], seen["z"] = target, z
        return torch.nn.functional.binary_cross_entropy(torch.sigmoid(z), target)

    import cramlm.models.objectives.rtd as electra

    monkeypatch.setattr(electra, "sample_tokens", fixed_samples)
    monkeypatch.setattr(electra.F, "binary_cross_entropy_with_logits", bce)
    out = model(inputs, labels=labels, sample_noise=torch.rand(ids.shape, dtype=torch.float64))
    scored = labels != -100
    corrupted = ids.clone()
    corrupted[scored] = fixed_samples(None, torch.zeros(int(scored.sum())), SPECIAL)
    expected = (corrupted != ids)[:, 1:].reshape(-1).float()  # every non-special position (all but [CLS])
    assert torch.equal(seen["target"], expected)
    assert 0 < expected.sum() < int(scored.sum())  # some replaced; the equal samples are labelled original
    assert float(out["loss"].detach()) == pytest.approx(float(out["mlm_loss"] + 50 * out["rtd_loss"]), rel=1e-6)
    # the discriminator saw the original tokens with the samples at the masked positions, not [MASK]
    z = model.detector(model.encode(corrupted)).squeeze(-1)[:, 1:].reshape(-1)
    torch.testing.assert_close(seen["z"], z)


def test_without_noise_the_loss_is_the_generators_mlm_loss():
    model = rtd_model().eval()
    inputs, labels = masked(random_ids(2, 16))
    with torch.no_grad():
        out = model(inputs, labels=labels)
        mlm, _ = model.generator(inputs, labels != -100, labels[labels != -100], None, None, None, None)
    assert out["logits"] is None and torch.equal(out["loss"], mlm)
    assert model(inputs)["logits"].shape == (2, 16)  # no labels: the detector's logits


def test_gradients_reach_both_networks_and_the_shared_embedding_from_both_losses():
    model = rtd_model().train()
    inputs, labels = masked(random_ids(2, 16))
    model(inputs, labels=labels, sample_noise=torch.rand(inputs.shape, dtype=torch.float64))["loss"].backward()
    for prefix in ("generator.trunk.blocks", "discriminator.trunk.blocks", "detector"):
        grads = [p.grad for n, p in model.named_parameters() if n.startswith(prefix)]
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads), prefix
    model.zero_grad()
    model(inputs, labels=labels)["loss"].backward()  # the generator's MLM loss alone also trains the embedding
    assert model.discriminator.tokens.weight.grad.abs().sum() > 0
    assert model.detector[0].weight.grad is None


def test_flops_per_token_count_generator_and_discriminator():
    model = rtd_model().train()
    B, T = 2, 16
    inputs, labels = masked(random_ids(B, T))  # 4 of 16 positions masked
    noise = torch.rand(inputs.shape, dtype=torch.float64)
    with torch.no_grad():
        forward = counted_flops(lambda: model(inputs, labels=labels, sample_noise=noise))
    assert forward == pytest.approx(model.forward_flops_per_token(T, 0.25) * B * T, rel=1e-9)
    train = counted_flops(lambda: model(inputs, labels=labels, sample_noise=noise)["loss"].backward())
    assert train == pytest.approx(model.flops_per_token(T, 0.25) * B * T, rel=0.02)
    # the counter saw both networks: the discriminator's trunk alone would be far less
    assert model.flops_per_token(T, 0.25) > 1.2 * model.discriminator.flops_per_token(T, 0.0)


def test_sampling_noise_is_keyed_by_stream_position():
    collate = MLMCollator(VOCAB, 4, SPECIAL, 0.25, seed=3, sample_noise=True)
    ids = random_ids(6, 16)
    whole = collate(ids, np.arange(10, 16))
    part = collate(ids[2:4], np.arange(12, 14))  # the same sequences, batched differently
    assert whole["sample_noise"].dtype == torch.float64 and whole["sample_noise"].shape == (6, 16)
    assert torch.equal(whole["sample_noise"][2:4], part["sample_noise"])
    assert torch.equal(whole["labels"], MLMCollator(VOCAB, 4, SPECIAL, 0.25, seed=3)(ids, np.arange(10, 16))["labels"])
    noise = whole["sample_noise"]
    assert 0 <= noise.min() and noise.max() < 1 and abs(noise.mean() - 0.5) < 0.1
    other = MLMCollator(VOCAB, 4, SPECIAL, 0.25, seed=4, sample_noise=True)(ids, np.arange(10, 16))
    assert not torch.equal(noise, other["sample_noise"])
    assert "sample_noise" not in MLMCollator(VOCAB, 4, SPECIAL, 0.25, seed=3)(ids, np.arange(10, 16))
    assert torch.equal(collate(ids)["sample_noise"], collate(ids, np.arange(6))["sample_noise"])  # a batch alone: 0 ... 5


def test_muon_takes_the_hidden_matrices_of_both_networks_but_not_the_detector_output():
    from cramlm.train.optim import hidden_matrices

    model = rtd_model()
    ids = {id(p) for p in hidden_matrices(model)}
    assert id(model.generator.trunk.tokens[1].weight) in ids and id(model.generator.dense.weight) in ids
    assert id(model.detector[0].weight) in ids and id(model.detector[2].weight) not in ids
    assert id(model.discriminator.tokens.weight) not in ids
    blocks = [p for n, p in model.named_parameters() if ".blocks." in n and p.ndim == 2]
    assert blocks and all(id(p) in ids for p in blocks)


@pytest.mark.parametrize("overrides", [{}, {"head_transform": True, "bias": True}, {"tie_embeddings": False}])
def test_every_trainable_parameter_gets_a_gradient(overrides):
    """The discriminator's MLM head is unused by RTD: frozen, so DDP sees no unused parameter."""
    torch.manual_seed(0)
    model = build_rtd(tiny_model("crammed-bert", **overrides), RTDConfig(), SPECIAL).train()
    inputs, labels = masked(random_ids(2, 16))
    model(inputs, labels=labels, sample_noise=torch.rand(inputs.shape, dtype=torch.float64))["loss"].backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing
    assert model.discriminator.tokens.weight.requires_grad
