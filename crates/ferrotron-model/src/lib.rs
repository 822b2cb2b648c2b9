//! GPT, LLaMA-style and Mixture-of-Experts models in burn, built from a plan
