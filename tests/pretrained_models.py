"""Tiny pretrained forecasters of the real architectures, with random weights, built with
the packages' own classes and saved with their own save methods: what a user's folder
of Chronos-Bolt, Chronos-2 or TimesFM 2.5 weights holds, at a few thousand parameters
(no model hub is reachable here)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

QUANTILES_BOLT = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
QUANTILES_2 = [0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6,
               0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99]


def chronos_bolt(folder: Path, seed: int = 0) -> Path:
    """A Chronos-Bolt (T5 encoder-decoder, patches of 16, context 128)."""
    import torch
    from chronos.chronos_bolt import ChronosBoltModelForForecasting
    from transformers import T5Config

    config = T5Config(
        d_model=8, d_ff=8, d_kv=4, num_heads=2, num_layers=1, num_decoder_layers=1,
        feed_forward_proj="relu", dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
        eos_token_id=1, vocab_size=2, initializer_factor=0.05, is_encoder_decoder=True,
        chronos_pipeline_class="ChronosBoltPipeline",
        chronos_config={"context_length": 128, "prediction_length": 16,
                        "input_patch_size": 16, "input_patch_stride": 16,
                        "quantiles": QUANTILES_BOLT, "use_reg_token": True})
    torch.manual_seed(seed)
    ChronosBoltModelForForecasting(config).save_pretrained(folder)
    return folder


def chronos_2(folder: Path, seed: int = 0) -> Path:
    """A Chronos-2 (which takes exogenous columns)."""
    import torch
    from chronos.chronos2 import Chronos2CoreConfig, Chronos2Model, Chronos2Pipeline

    config = Chronos2CoreConfig(
        d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2, feed_forward_proj="relu",
        attn_implementation="sdpa", chronos_pipeline_class="Chronos2Pipeline",
        chronos_config={"context_length": 128, "input_patch_size": 16,
                        "input_patch_stride": 16, "output_patch_size": 16,
                        "max_output_patches": 4, "quantiles": QUANTILES_2,
                        "use_reg_token": True, "use_arcsinh": True,
                        "time_encoding_scale": 128})
    torch.manual_seed(seed)
    Chronos2Pipeline(model=Chronos2Model(config)).save_pretrained(folder)
    return folder


def timesfm_25(folder: Path, seed: int = 0) -> Path:
    """A TimesFM 2.5 of width 32 and one layer (its module's definition replaced before
    it is built: the package fixes the size in the class)."""
    import torch
    from timesfm.timesfm_2p5 import timesfm_2p5_base, timesfm_2p5_torch

    base = timesfm_2p5_base.TimesFM_2p5_200M_Definition()
    width, stacked = 32, base.stacked_transformers
    definition = dataclasses.replace(
        base,
        tokenizer=dataclasses.replace(base.tokenizer, hidden_dims=width, output_dims=width),
        stacked_transformers=dataclasses.replace(stacked, num_layers=1,
                                                 transformer=dataclasses.replace(
                                                     stacked.transformer, model_dims=width,
                                                     hidden_dims=width, num_heads=2)),
        output_projection_point=dataclasses.replace(base.output_projection_point,
                                                    input_dims=width, hidden_dims=width),
        output_projection_quantiles=dataclasses.replace(base.output_projection_quantiles,
                                                        input_dims=width, hidden_dims=width))
    module_class = type("TinyTimesFM", (timesfm_2p5_torch.TimesFM_2p5_200M_torch_module,),
                        {"config": definition})
    torch.manual_seed(seed)
    model = timesfm_2p5_torch.TimesFM_2p5_200M_torch.__new__(
        timesfm_2p5_torch.TimesFM_2p5_200M_torch)
    model.model, model.torch_compile = module_class(), False
    folder.mkdir(parents=True, exist_ok=True)
    model._save_pretrained(folder)
    return folder


BUILDERS = {"bolt": chronos_bolt, "chronos2": chronos_2, "timesfm": timesfm_25}
KINDS = {"bolt": "chronos", "chronos2": "chronos", "timesfm": "timesfm"}
