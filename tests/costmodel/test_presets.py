"""The hardware presets: datasheet numbers, the derived tables, and the host builder.

A failure means a preset lost a datasheet figure or a source, the wave-quantization table
no longer follows NVIDIA's rule (tiles ÷ (waves × SMs) × the large-GEMM efficiency), a
name is accepted that should be refused, or the host's per-rank share rule changed.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from impls.costmodel.presets import HARDWARE, hardware, host_hardware


def test_the_agreed_presets_exist_with_datasheet_numbers():
    a40, a80, h100, v100 = (
        hardware(n) for n in ("a100_40gb", "a100_80gb", "h100_sxm", "v100_32gb")
    )
    assert a40.peak("bf16") == 312e12 and a40.peak("fp32") == 19.5e12
    assert a40.memory_bandwidth == 1555e9 and a80.memory_bandwidth == 2039e9
    assert a80.memory_bytes == 80e9 and a40.memory_bytes == 40e9
    assert a40.intra.bandwidth == 300e9 and a40.inter.bandwidth == 25e9  # 600/2, 200 Gb/s
    assert h100.peak("bf16") == 989e12 and h100.peak("fp8") == 1979e12
    assert h100.intra.bandwidth == 450e9 and h100.inter.bandwidth == 50e9  # 900/2, 400 Gb/s
    assert h100.intra.effective_bandwidth == pytest.approx(370e9)  # nccl-tests #212
    assert v100.peak("fp16") == 125e12 and v100.memory_bandwidth == 900e9
    summit = hardware("v100_summit")
    assert summit.devices_per_node == 6 and summit.memory_bytes == 16e9
    assert summit.inter.bandwidth * 6 == pytest.approx(25e9)  # dual-rail EDR per node
    with pytest.raises(ValueError, match="dtype='bf16'"):
        v100.peak("bf16")  # Volta has no bf16


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_every_preset_names_its_sources(name):
    sources = HARDWARE[name].sources
    for key in (
        "peak_flops",
        "memory",
        "gemm_efficiency",
        "alpha_s",
        "kernel_overhead_s",
        "intra.efficiency",
        "inter.efficiency",
        "elementwise_efficiency",
    ):
        assert sources.get(key), f"{name}: no source for {key}"


def test_wave_quantization_table_by_hand():
    hw = hardware("a100_80gb")
    table = dict(hw.gemm_efficiency)
    # 1024³ in 256×128 tiles: 4·8 = 32 tiles on 108 SMs, one wave: 32/108 of 85.9 %
    assert table[2.0 * 1024**3] == pytest.approx(0.859 * 32 / 108)
    # 4096³: 16·32 = 512 tiles, 5 waves of 108: 512/540
    assert table[2.0 * 4096**3] == pytest.approx(0.859 * 512 / 540)
    assert hw.efficiency(1e13) == pytest.approx(0.859)  # MAMF plateau
    assert hw.efficiency(2.0 * 6912 * 16384 * 2048) == pytest.approx(0.859)


def test_unknown_name_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="hardware='tpu': unknown; choose one of a100_40gb"):
        hardware("tpu")


def test_host_hardware_from_a_calibration():
    cal = {
        "peak_fp32_flops": 100e9,
        "peak_bf16_flops": 50e9,
        "memory_bandwidth": 10e9,
        "gemm_table": ((1e9, 0.5), (1e6, 0.1)),
        "kernel_overhead_s": 2e-6,
    }
    hw = host_hardware(cal, (1e-5, 1e-9), 0.5)
    assert hw.peak("fp32") == pytest.approx(50e9) and hw.peak("bf16") == pytest.approx(25e9)
    assert hw.memory_bandwidth == pytest.approx(5e9)
    assert hw.intra is hw.inter and hw.intra.bandwidth == pytest.approx(1e9)
    assert hw.gemm_efficiency == ((1e6, 0.1), (1e9, 0.5))  # sorted
    assert hw.kernel_overhead_s == 2e-6 and not hw.comm_overlap
    assert host_hardware(cal, (1e-5, 1e-9), overhead_s=0.0).kernel_overhead_s == 0.0


@pytest.mark.parametrize("key", ["kernel_overhead_s", "action_overhead_s", "collective_meeting_s"])
@pytest.mark.parametrize("value", [-1e-6, float("nan"), float("inf"), "1ms"])
def test_overheads_must_be_finite_and_not_negative(key, value):
    """A per-kernel or per-action overhead that is negative, not finite or not a number is
    refused naming the field; the GPU presets carry none per action or per meeting."""
    from dataclasses import replace

    base = hardware("a100_80gb")
    assert base.action_overhead_s == 0.0 and base.collective_meeting_s == 0.0
    with pytest.raises(ValueError, match=f"{key}="):
        replace(base, **{key: value})


@pytest.mark.parametrize("name", ["a100_40gb", "a100_80gb", "h100_sxm"])
def test_flash_attention_efficiency_is_cited_per_gpu(name):
    hw = HARDWARE[name]
    assert hw.attention_efficiency is not None
    assert "FlashAttention" in hw.sources["attention_efficiency"]
    for _, forward, backward in hw.attention_efficiency:
        assert 0 < backward <= 0.75 and 0 < forward <= 0.75  # FA-2: ≤ 73 % (A100)


def test_h100_attention_rises_with_sequence_length_as_measured():
    """FlashAttention-2 on H100 as the FlashAttention-3 paper measured it (Figs. 5–6)."""
    hw = HARDWARE["h100_sxm"]
    short = hw.attention_seconds(1e12, 512, "bf16", backward=False, kernels=0)
    long_ = hw.attention_seconds(1e12, 16384, "bf16", backward=False, kernels=0)
    assert short == pytest.approx(1e12 / 191e12)
    assert long_ == pytest.approx(1e12 / 335e12)
    assert hw.attention_seconds(1e12, 65536, "bf16", backward=True, kernels=0) == pytest.approx(
        1e12 / 322e12
    )  # clamped beyond the last point


@pytest.mark.parametrize(
    "table",
    [
        (),
        ((2048, 0.0, 0.5),),
        ((2048, 0.5, 1.2),),
        ((4096, 0.5, 0.5), (2048, 0.5, 0.5)),
        ((2048, 0.5),),
    ],
)
def test_attention_efficiency_table_is_validated(table):
    with pytest.raises(ValueError, match="attention_efficiency"):
        replace(HARDWARE["a100_80gb"], attention_efficiency=table)


def test_fp8_gemms_run_at_the_cited_fp8_mamf_not_the_bf16_one():
    """stas00/ml-engineering MAMF FP8 table: H100 SXM 1402.6 of 1979 TFLOP/s."""
    h100 = HARDWARE["h100_sxm"]
    big = 2.0 * 1024 * 9216 * 14336
    assert h100.efficiency(big, "fp8") == pytest.approx(1402.6 / 1979)
    assert h100.efficiency(1e16, "bf16") == pytest.approx(0.801)  # the bf16 table, untouched
    assert h100.efficiency(1e16, "fp8") == pytest.approx(1402.6 / 1979)
    assert h100.gemm_seconds(1024, 9216, 14336, "fp8") == pytest.approx(
        big / 1402.6e12 + h100.kernel_overhead_s
    )
    assert "FP8" in h100.sources["fp8_gemm_efficiency"]


def test_fp8_without_a_cited_efficiency_is_refused_naming_the_key():
    no_fp8_table = replace(HARDWARE["h100_sxm"], fp8_gemm_efficiency=None)
    with pytest.raises(ValueError, match=r"dtype='fp8'.*no cited fp8"):
        no_fp8_table.gemm_seconds(4096, 4096, 4096, "fp8")
    no_fp8_table.gemm_seconds(4096, 4096, 4096, "bf16")  # other dtypes unaffected
    with pytest.raises(ValueError, match="fp8_gemm_efficiency"):
        replace(HARDWARE["h100_sxm"], fp8_gemm_efficiency=((1e9, 1.5),))
