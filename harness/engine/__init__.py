"""vLLM itself: servers (process groups on 127.0.0.1), the OpenAI client, models and their materialization, /metrics, the test-only site plugins, broken checkpoints, GPUs."""
