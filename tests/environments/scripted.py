"""An engine whose answers a rule writes from the prompt's text, recording what it returned (as
``tests/rollout/test_agent.py``'s ``Recording`` does), for episodes whose course a test must know."""

from areal_trainer.rollout.types import Generation


class RuleEngine:
    """Answers each prompt with ``rule(prompt text)``, ended by the tokenizer's EOS, with distinct made-up
    log-probs and version 3; ``returned`` holds every (prompt ids, Generation)."""

    max_positions = None

    def __init__(self, tokenizer, rule):
        self.tokenizer, self.rule, self.returned = tokenizer, rule, []

    def generate(self, prompts, gconfig):
        out = []
        for p in prompts:
            text = self.rule(self.tokenizer.decode(p))
            ids = self.tokenizer(text, add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [-0.25 * (k + 1) for k in range(len(ids))], False, [3] * len(ids)))
        self.returned += [(list(p), g) for p, g in zip(prompts, out)]
        return out
