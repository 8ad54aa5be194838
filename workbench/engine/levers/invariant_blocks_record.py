"""Calibrated row blocks of the bundled model per (mlx version, BLAS): written by
`python -m workbench.engine.levers.invariant_record` (run it under each BLAS), checked by
tests/engine/test_invariant_blocks.py."""

RECORDED = {
    "mlx 0.32.4 | openblas 0.3.21 Cooperlake": {
        "('Embedding', (4096, 128), 'mlx.core.float32', False, None, None, None)": [1, 32],
        "('Linear', (128, 128), 'mlx.core.float32', False, None, None, None)": [10, 32],
        "('Linear', (128, 352), 'mlx.core.float32', False, None, None, None)": [10, 32],
        "('Linear', (352, 128), 'mlx.core.float32', False, None, None, None)": [4, 32],
        "('Linear', (4096, 128), 'mlx.core.float32', False, None, None, None)": [1, 32],
        "('Linear', (64, 128), 'mlx.core.float32', False, None, None, None)": [1, 18],
    },
    "mlx 0.32.4 | reference": {
        "('Embedding', (4096, 128), 'mlx.core.float32', False, None, None, None)": [1, 32],
        "('Linear', (128, 128), 'mlx.core.float32', False, None, None, None)": [1, 32],
        "('Linear', (128, 352), 'mlx.core.float32', False, None, None, None)": [1, 32],
        "('Linear', (352, 128), 'mlx.core.float32', False, None, None, None)": [1, 32],
        "('Linear', (4096, 128), 'mlx.core.float32', False, None, None, None)": [1, 32],
        "('Linear', (64, 128), 'mlx.core.float32', False, None, None, None)": [1, 32],
    },
}
