"""The pipeline file the first users wrote (README, "Pipelines"), verbatim: m27 must accept
it as it stands, so several suites read this one copy."""

SEED = """\
pipeline:
  - name: preprocessing
    type: cpu
    command: python prepare_pdb.py --input {{INPUT_FILE}}
    output: /tmp/preprocessed.pdb
  - name: md_simulation
    type: gpu
    depends_on: [preprocessing]
    checkpoint: 300s   # save incremental state every 5 minutes
    command: gmx mdrun -deffnm simulation -v
  - name: analysis
    type: gpu_light
    depends_on: [md_simulation]
    command: python analyze_trajectory.py
"""
