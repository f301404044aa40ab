"""data/sft.py's chat templates: which roles a template renders, whether or not it names them."""

from __future__ import annotations

import pytest

from tcsm.data.sft import ChatTemplate

TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}A: {{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A: {% endif %}"
)


@pytest.mark.parametrize("template", [
    # the assistant turn rendered through {% else %}: the template never names it
    ("{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n{% else %}A: {{ m['content'] }}\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}A: {% endif %}"),
    # the standard ChatML template: every role rendered by name
    ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
])  # fmt: skip
def test_a_template_that_renders_a_role_knows_it_without_naming_it(template):
    t = ChatTemplate(template)
    assert t.knows("user") and t.knows("assistant")


def test_a_template_that_renders_no_such_role_does_not_know_it():
    t = ChatTemplate(TEMPLATE)
    assert t.knows("user") and t.knows("assistant") and not t.knows("gpt") and not t.knows("system")
    strict = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
                          "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")  # fmt: skip
    assert strict.knows("assistant") and strict.knows("user")
