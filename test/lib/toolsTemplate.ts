/** A Hermes/Qwen-style chat template with tool support, for a tiny model that carries it. */
export const TOOLS_TEMPLATE =
  "{%- if tools %}<|im_start|>system\nYou may call these functions:\n<tools>\n{%- for tool in tools %}\n{{ tool | tojson }}\n{%- endfor %}\n</tools>\n" +
  'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>\n{% endif %}' +
  "{%- for message in messages %}" +
  "{%- if message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n" +
  "{%- elif message.tool_calls %}<|im_start|>assistant\n{%- for call in message.tool_calls %}\n<tool_call>\n" +
  '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n' +
  "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}{%- endfor %}" +
  "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}";
