#pragma once
// The text ds4-synth trains its byte-level BPE on: a few KB written for this project, mixing
// English prose, chat-style turns, C++/Python/JSON, numbers and punctuation runs, and Chinese
// and Japanese, so the learned merges exercise every rule of the §6 pre-tokenizer (digit runs,
// CJK runs, punctuation+letters, space+word, trailing newlines after punctuation).
#include <string_view>

namespace ds4::synth {

inline constexpr std::string_view training_corpus = R"corpus(
The quick brown fox jumps over the lazy dog. The dog did not mind; it was asleep in the sun.
A synthetic model is a file with the right names, the right types and the right shapes, but
with random weights. It lets us test the loader, the kernels and the server without waiting
for an 81 GiB download. The weights are random, but they are not wild: every scale is finite,
every norm is close to one, and every projection has a small, realistic spread.

User: What is the capital of France?
Assistant: The capital of France is Paris. It is also the largest city in the country.
User: And how many people live there?
Assistant: About 2.1 million people live in the city itself, and roughly 12 million in the
wider metropolitan area. Numbers like 2024, 1048576 and 3.14159 are split into short runs.

Think step by step. First, read the question. Second, list what you know. Third, check each
step before you answer. If you are not sure, say so; it is better than guessing.

int main(int argc, char** argv) {
    std::vector<float> values(1024, 0.0f);
    for (std::size_t i = 0; i < values.size(); ++i) {
        values[i] = static_cast<float>(i) * 0.5f;
    }
    if (argc > 1 && std::string(argv[1]) == "--help") {
        std::printf("usage: %s [--help]\n", argv[0]);
        return 0;
    }
    return values.empty() ? 1 : 0;
}

def tokenize(text: str) -> list[int]:
    """Split text into pieces, then merge the pieces with the learned ranks."""
    pieces = pretokenize(text)
    ids = []
    for piece in pieces:
        ids.extend(bpe(piece))
    return ids

class Cache:
    def __init__(self, capacity=128):
        self.capacity = capacity
        self.rows = {}

    def get(self, key, default=None):
        return self.rows.get(key, default)

{"model": "deepseek4", "layers": 43, "experts": 256, "active": 6, "window": 128,
 "ratios": [0, 0, 4, 128, 4, 128], "clamp": 10.0, "stream": true, "stop": ["\n\n", "</s>"]}

SELECT name, count(*) AS n FROM tokens WHERE length(name) > 3 GROUP BY name ORDER BY n DESC;
<div class="answer"><p>Hello, world!</p><a href="https://example.com/docs?page=2">next</a></div>
x += y * (z - 1); if (a != b && c <= d || e >= f) { return -1; } // compare, then branch
$ cmake -S . -B build && cmake --build build -j 2 && ctest --test-dir build --output-on-failure

The weather today is mild. Tomorrow it will rain in the morning and clear up by the evening.
She said: "I'll be there at 9:30 -- don't wait for me!" He replied, 'Fine... see you then.'
Lists: apples, oranges, pears; tools: hammer, saw, drill; colours: red, green, blue, yellow.

今天天气很好，我们一起去公园散步吧。模型的每一层都有注意力和专家网络。
深度学习需要大量的数据和计算资源，但是合成模型可以帮助我们快速测试。
请把这段文字翻译成英文，然后检查语法是否正确。谢谢你的帮助！
東京は日本の首都です。ひらがなとカタカナと漢字を使って文章を書きます。
このモデルはテストのためのものです。ありがとうございました。
Mixed text: the model 模型 has 43 layers 层 and a vocabulary of 129280 tokens.

Ünïcödé wörds like café, naïve, résumé and Straße are letters too; so are Ελληνικά and русский.
Emoji and symbols: ✓ ✗ → ← ★ ♥ € £ ¥ © ® ™ ± × ÷ ∞ ≈ ≠ ≤ ≥ √ ∑ ∫ π.

The end of a line matters;
so does the end of a block.
  Indented lines keep their spaces,
    and deeper ones keep more.
	Tabs are whitespace as well.

Repeat for frequency: the the the model model model token token token layer layer layer.
The model reads the tokens, the layers mix the tokens, and the head predicts the next token.
)corpus";

}  // namespace ds4::synth
