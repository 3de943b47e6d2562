"""The roofline advisor: what the hardware allows one model, GPU and workload, before any run.

From datasheet figures alone it works out the floors of one model on one GPU under one
workload (weight and KV-cache bytes, how many sequences fit, the TTFT and TPOT floors, the
decode ceiling, which bottleneck the workload hits) and what each of this project's techniques
would gain by the same arithmetic; beside them, the predicted compression cost model of a GPU
profile (the `compression.cost_model` that serve_config.gpu.yaml ships).

    make advise     # the GPU profile's case (docs/benchmarks.md); ADVISE_ARGS="..." for another
    rag-advisor --model llama-3-8b --gpu l4 --quantization awq \\
        --prompt-tokens 1500 --cached-tokens 256 --output-tokens 200 --concurrency 16
    python -m advisor --help                      # the same, without the console script
    python -m advisor.compression_costs --help    # `make gpu-costs` runs the GPU profile's

Modules: `hardware` (the model and GPU presets), `floors` (the arithmetic), `recommendations`
(each technique's gain), `cli` (the report and the command line), `compression_costs` (the
cost model's prediction). It is a tool for users, not an experiment: it imports nothing from
bench, app, deployments or Ray; the labs in bench import it.
"""
