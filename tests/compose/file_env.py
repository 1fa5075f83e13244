"""A generated-style environment module (defines make_env()), as the environments stage
stores them: composition loads it from a file or from code, always in the sandbox."""


class Env:
    name = "toy/say_seed"
    capability = "say_seed"
    domain = "toy"
    version = 1

    def __init__(self):
        self.seed = 0
        self.answer = None

    def reset(self, seed):
        self.seed, self.answer = seed, None

    @property
    def system_prompt(self):
        return "Answer with the number."

    @property
    def tool_schemas(self):
        return []

    @property
    def messages(self):
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"say {self.seed}"}]

    @property
    def hint(self):
        return None

    def step(self, action):
        self.answer = action.get("content")
        return "ok"

    @property
    def done(self):
        return self.answer is not None

    def summary(self):
        text = self.answer or ""
        reward = sum(c.isdigit() for c in text) / max(len(text), 1)
        return {"reward": reward, "passed": str(self.seed) in text, "steps": 1, "reasons": []}


def make_env():
    return Env()
