"""The user's GAE-style link model behind the link protocol: encode on an ego-graph, decode of
pairs and of one node against a table, the engine's scores and the stored embeddings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model import link as link_module
from model.link import LinkModel, LinkPredictor, answer_scores
from model.link_assets import full_graph_embeddings
from model.served_link import UserLinkModel, check_link_methods
from model.user_model import Output, UserModelConfig
from tests.edge_graph import EDGE_DIM, FEATURES, edge_feature_store
from tests.unit.archive_build import user_models


def adapter(module: torch.nn.Module, edge_input: str = "none", **config) -> UserLinkModel:
    return UserLinkModel(
        module.eval(),
        UserModelConfig(
            task="link",
            model_class=type(module).__name__,
            in_dim=FEATURES,
            out_dim=8,
            num_layers=2,
            edge_input=edge_input,
            **config,
        ),
    ).eval()


def test_the_adapter_and_the_preset_both_implement_the_link_protocol():
    torch.manual_seed(0)
    model = adapter(user_models.SageLink(FEATURES, 16, 8))
    assert isinstance(model, LinkModel) and model.decoder_name == "SageLink.decode"
    preset = LinkPredictor(link_module.ModelConfig(task="link", in_dim=FEATURES, out_dim=8))
    assert isinstance(preset, LinkModel) and preset.decoder_name == "DotDecoder"


def test_forward_is_encode_and_score_is_decode_of_the_pairs(monkeypatch):
    torch.manual_seed(0)
    module = user_models.EdgeGatLink(FEATURES, 16, EDGE_DIM).eval()
    model = adapter(module, edge_input="edge_attr")
    x = torch.randn(30, FEATURES)
    edge_index = torch.randint(0, 30, (2, 90))
    edge_attr = torch.rand(90, EDGE_DIM)
    pairs = torch.randint(0, 30, (2, 12))
    with torch.no_grad():
        z = module.encode(x, edge_index, edge_attr)
        assert torch.equal(model(x, edge_index, degree=None, edge_attr=edge_attr), z)
        expected = module.decode(z, pairs)
        assert torch.allclose(model.score(z[pairs[0]], z[pairs[1]]), expected, atol=1e-6)
        monkeypatch.setattr("model.link.SCORE_CHUNK_ROWS", 7)  # several chunks
        against = model.score_against(z[4], z)
        every = torch.stack([torch.full((30,), 4), torch.arange(30)])
        assert torch.allclose(against, module.decode(z, every), atol=1e-6)


def test_a_decode_with_one_column_per_pair_is_flattened_and_a_wrong_shape_refused():
    torch.manual_seed(0)
    model = adapter(user_models.SageLink(FEATURES, 16, 8))
    z = torch.randn(5, 8)
    model.module.decode = lambda z, index: (z[index[0]] * z[index[1]]).sum(-1, keepdim=True)
    assert model.score(z[:2], z[2:4]).shape == (2,)
    model.module.decode = lambda z, index: z[index[0]]
    with pytest.raises(ValueError, match=r"decode must return one score per pair, a \[2\]"):
        model.score(z[:2], z[2:4])


def test_a_module_without_decode_is_refused_in_one_line():
    with pytest.raises(ValueError, match="EncodeOnly has no decode method") as error:
        check_link_methods(user_models.EncodeOnly(FEATURES, 8))
    assert "\n" not in str(error.value) and "GAE convention" in str(error.value)
    with pytest.raises(ValueError, match="has no encode or decode method"):
        check_link_methods(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("output", "expected"),
    [(Output.LOGITS, torch.sigmoid(torch.tensor([-2.0, 3.0]))), (Output.RAW, [-2.0, 3.0])],
)
def test_scores_are_the_sigmoid_of_logits_and_other_outputs_as_they_are(output, expected):
    got = answer_scores(torch.tensor([-2.0, 3.0]), output)
    assert torch.allclose(got, torch.as_tensor(expected))
    assert torch.equal(
        answer_scores(torch.tensor([0.2]), Output.PROBABILITIES), torch.tensor([0.2])
    )


def test_the_stored_embeddings_are_encode_on_the_whole_graph_with_its_edge_features(tmp_path):
    store = edge_feature_store(tmp_path)
    torch.manual_seed(0)
    module = user_models.EdgeGatLink(FEATURES, 16, EDGE_DIM).eval()
    stored = full_graph_embeddings(adapter(module, edge_input="edge_attr"), store)
    with torch.no_grad():
        expected = module.encode(
            torch.from_numpy(np.array(store.features)),
            torch.from_numpy(store.edge_index()),
            torch.from_numpy(np.array(store.edge_features)),
        )
    assert np.array_equal(stored, expected.numpy())
