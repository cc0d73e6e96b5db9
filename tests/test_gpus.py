"""GPU catalog: datasheet peaks, precision fallbacks, units, overrides and bad names."""
from __future__ import annotations

import pytest

from costmodel.errors import InputError
from costmodel.gpus import GPU_CATALOG, PRECISIONS, catalog_name_for_product, get_gpu, intra_link_for_product


def test_catalog_has_the_required_entries_with_sources():
    """Every GPU the brief lists is present under its own name, cites a source and has positive figures."""
    required = {"V100-SXM2-32GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "H100-PCIe",
                "H200", "L40S", "MI250X", "MI300X", "CPU"}
    assert required <= set(GPU_CATALOG)
    for name, spec in GPU_CATALOG.items():
        assert spec.name == name
        assert spec.source.strip()
        assert spec.mem_gib > 0 and spec.mem_bw_GBps > 0
        assert set(spec.peak_tflops) <= set(PRECISIONS) and "fp32" in spec.peak_tflops


def test_reference_fact_peaks_in_si_units():
    """docs/facts.md: A100 312 TFLOP/s bf16, 156 tf32, 19.5 fp32; H100 SXM ~989 bf16 and ~1979 fp8 (2x)."""
    a100 = get_gpu("A100-SXM4-80GB")
    assert a100.peak_flops("bf16") == pytest.approx(312e12)
    assert a100.peak_flops("tf32") == pytest.approx(156e12)
    assert a100.peak_flops("fp32") == pytest.approx(19.5e12)
    h100 = get_gpu("H100-SXM5-80GB")
    assert h100.peak_flops("bf16") == pytest.approx(989e12, rel=1e-3)
    assert h100.peak_flops("fp8") == pytest.approx(2 * h100.peak_flops("bf16"), rel=1e-3)


def test_h200_is_h100_compute_with_more_memory():
    """docs/facts.md: H200 has H100's compute, 141 GB HBM3e at 4.8 TB/s (vs 80 GB at 3.35 TB/s)."""
    h100, h200 = get_gpu("H100-SXM5-80GB"), get_gpu("H200")
    for p in PRECISIONS:
        assert h200.peak_flops(p) == h100.peak_flops(p)
    assert (h200.mem_gib, h200.mem_bw_GBps) == (141, 4800)
    assert (h100.mem_gib, h100.mem_bw_GBps) == (80, 3350)


def test_precision_fallbacks():
    """V100 has fp16 tensor cores only: bf16 and fp8 run at 125 TFLOP/s, tf32 at the 15.7 fp32 rate;
    A100 has no fp8, so fp8 runs at its bf16 rate; the CPU placeholder runs everything at fp32."""
    v100 = get_gpu("V100-SXM2-32GB")
    assert v100.peak_flops("bf16") == pytest.approx(125e12)
    assert v100.peak_flops("fp8") == pytest.approx(125e12)
    assert v100.peak_flops("tf32") == pytest.approx(15.7e12)
    assert get_gpu("A100-SXM4-40GB").peak_flops("fp8") == pytest.approx(312e12)
    cpu = get_gpu("CPU")
    assert {cpu.peak_flops(p) for p in PRECISIONS} == {cpu.peak_flops("fp32")}


def test_unknown_precision_raises_input_error():
    """Only an unknown precision name is an error, and it names the 'precision' field and the allowed values."""
    with pytest.raises(InputError) as exc:
        get_gpu("A100-SXM4-80GB").peak_flops("int4")
    assert exc.value.field == "precision"
    assert "'int4'" in str(exc.value) and "bf16" in str(exc.value)


def test_unit_conversions():
    """mem_bytes uses GiB (2**30) and mem_bw_Bps GB/s (1e9): A100 80GB = 85,899,345,920 bytes, 2.039e12 B/s."""
    a100 = get_gpu("A100-SXM4-80GB")
    assert a100.mem_bytes == 85_899_345_920
    assert a100.mem_bw_Bps == pytest.approx(2.039e12)


def test_unknown_gpu_lists_allowed_names():
    """get_gpu names the field and source it was given and lists every catalog name."""
    with pytest.raises(InputError) as exc:
        get_gpu("A200", source="cluster.yaml", field="node_types.x.gpu")
    err = exc.value
    assert (err.source, err.field) == ("cluster.yaml", "node_types.x.gpu")
    assert all(name in str(err) for name in GPU_CATALOG)


def test_overrides_merge_peaks_and_leave_the_catalog_alone():
    """with_overrides replaces only the given peak keys, keeps the name, notes the override; the catalog entry is unchanged."""
    base = get_gpu("A100-SXM4-80GB")
    capped = base.with_overrides(peak_tflops={"bf16": 250.0}, mem_gib=40)
    assert capped.name == base.name
    assert capped.peak_flops("bf16") == pytest.approx(250e12)
    assert capped.peak_flops("tf32") == base.peak_flops("tf32")
    assert capped.mem_gib == 40 and "overridden" in capped.source
    assert base.peak_flops("bf16") == pytest.approx(312e12) and base.mem_gib == 80
    with pytest.raises(InputError) as exc:
        base.with_overrides(name="B100")
    assert exc.value.field == "name"


def test_spec_is_immutable_and_hashable():
    """GpuSpec is frozen with a read-only peak mapping, and equal specs hash equally (usable as dict keys)."""
    spec = get_gpu("L40S")
    with pytest.raises(TypeError):
        spec.peak_tflops["bf16"] = 1.0  # type: ignore[index]
    rebuilt = type(spec)(spec.name, dict(spec.peak_tflops), spec.mem_gib, spec.mem_bw_GBps, spec.source)
    assert rebuilt == spec and len({spec: 1, rebuilt: 2}) == 1


def test_non_positive_override_rejected():
    """A zero or negative figure is bad input naming the field."""
    with pytest.raises(InputError) as exc:
        get_gpu("H200").with_overrides(mem_bw_GBps=0)
    assert exc.value.field == "mem_bw_GBps"


def test_h800_is_the_h100_sxm_chip_with_its_efficiencies():
    """NVIDIA H800 datasheet (SXM): H100 SXM's peaks and HBM3 (80 GB, 3.35 TB/s); the default
    profile gives it the H100 entry, so the same plan on either simulates the same compute."""
    from costmodel.profile import load_profile
    h100, h800 = get_gpu("H100-SXM5-80GB"), get_gpu("H800")
    for p in PRECISIONS:
        assert h800.peak_flops(p) == h100.peak_flops(p)
    assert (h800.mem_gib, h800.mem_bw_GBps) == (80, 3350)
    prof = load_profile(None)
    assert prof.gpu("H800") == prof.gpu("H100-SXM5-80GB")


@pytest.mark.parametrize("product, entry", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H800", "H800"),
    ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-SXM4-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-SXM4-80GB"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_catalog_name_for_product(product, entry):
    """The names CUDA drivers report (torch.cuda.get_device_name) map to the catalog entry
    of that part, upper or lower case alike; the NVL boards and parts the catalog lacks map
    to none (benchmarks/calibrate_cuda.sh then asks for a catalog entry or a topology)."""
    assert catalog_name_for_product(product) == entry
    assert catalog_name_for_product(product.upper()) == entry
    assert entry is None or entry in GPU_CATALOG


@pytest.mark.parametrize("product, kind, bw", [
    # NVLink 4: 18 links x 25 GB/s a direction (H100/H200 datasheets: 900 GB/s both ways).
    ("NVIDIA H100 80GB HBM3", "nvswitch", 18 * 25.0),
    ("NVIDIA H200", "nvswitch", 18 * 25.0),
    # NVLink 3: 12 x 25 (A100 datasheet: 600 GB/s both ways); NVLink 2: 6 x 25 (V100: 300).
    ("NVIDIA A100-SXM4-80GB", "nvswitch", 12 * 25.0),
    ("Tesla V100-SXM2-32GB", "nvswitch", 6 * 25.0),
    # H800 SXM: 400 GB/s both directions together.
    ("NVIDIA H800", "nvswitch", 400 / 2),
    # PCIe boards talk over PCIe Gen4 x16: 16 GT/s x 16 lanes x 128/130 / 8 bits = 31.5 GB/s.
    ("NVIDIA A100-PCIE-40GB", "pcie", round(16 * 16 * 128 / 130 / 8, 1)),
    ("NVIDIA H100 PCIe", "pcie", round(16 * 16 * 128 / 130 / 8, 1)),
    ("NVIDIA L40S", "pcie", round(16 * 16 * 128 / 130 / 8, 1)),
])
def test_intra_link_for_product(product, kind, bw):
    """benchmarks/calibrate_cuda.sh's guessed fabric: SXM parts get NVSwitch at their NVLink
    rate per direction (links x 25 GB/s, worked from the datasheets), PCIe boards PCIe Gen4
    x16."""
    link = intra_link_for_product(product)
    assert link["kind"] == kind
    assert link["bw_GBps"] == pytest.approx(bw)


def test_intra_link_for_a_product_without_an_entry():
    """A part the catalog lacks gets no guessed fabric (calibrate_cuda.sh then asks for a
    topology)."""
    assert intra_link_for_product("NVIDIA GeForce RTX 4090") is None


def test_intra_link_matches_the_bundled_dgx_topologies():
    """The guessed fabric of an H100 or A100 SXM node equals the intra link the bundled
    dgx-h100 and dgx-a100 topology files give (written separately from the same datasheets)."""
    from pathlib import Path
    import yaml
    root = Path(__file__).resolve().parent.parent / "topologies"
    for product, fname in (("NVIDIA H100 80GB HBM3", "dgx-h100.yaml"), ("NVIDIA A100-SXM4-80GB", "dgx-a100.yaml")):
        topo = yaml.safe_load((root / fname).read_text())
        (node,) = topo["node_types"].values()
        assert intra_link_for_product(product) == {k: float(v) if k != "kind" else v
                                                    for k, v in node["intra"].items()}
