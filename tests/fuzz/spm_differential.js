// Differential check of the SentencePiece tokenizer's fast mode against Hugging Face's tokenizers (its Node binding,
// the Rust core): random strings drawn from characters where the pipeline has its corners (whitespace of every kind,
// zero-width and format characters, combining marks, full-width forms and ligatures the character map rewrites,
// Hangul jamo, Indic conjuncts, emoji sequences, regional indicators, spellings of control and byte pieces, special
// tokens) are encoded without special tokens by both; every id list must be equal. A developer step, not run by CI:
//
//   mkdir -p /tmp/tok && (cd /tmp/tok && npm install tokenizers@0.23.2)
//   NODE_PATH=/tmp/tok/node_modules node tests/fuzz/spm_differential.js build/release/examples/dea \
//       tests/data/deberta/spm/spm_nfkc.model tests/data/deberta/spm/spm_nfkc.tokenizer.json [COUNT] [SEED]
//
// (likewise spm_identity.model with spm_identity.tokenizer.json). A tokenizer.json there is the fast pipeline that
// transformers' DeBERTa-v2 converter builds from the model beside it. Prints the number of strings and of
// differences, and the first few differences; exits 1 when there is any.
'use strict';
const { Tokenizer } = require('tokenizers');
const { execFileSync } = require('child_process');

const [, , dea, model, tokenizerJson, countArg, seedArg] = process.argv;
if (!dea || !model || !tokenizerJson) {
  console.error('usage: node spm_differential.js DEA_PROGRAM SPM_MODEL TOKENIZER_JSON [COUNT] [SEED]');
  process.exit(2);
}
const count = Number(countArg || 20000);
let state = Number(seedArg || 7);
// a linear congruential generator: the same strings for the same seed
function uniform() {
  state = (state * 1103515245 + 12345) % 2147483648;
  return state / 2147483648;
}
const alphabet = [
  'a', 'b', 'e', 'E', 't', 'h', ' ', ' ', ' ', '  ', '.', ',', '!', '0', '9',
  '\t', '\n', '\r', '\u000b', '\u0085', '\u00a0', '\u3000', '\u2028', '\u200b', '\ufeff', '\u200e', '\u200f', '\u00ad',
  '\u0301', '\u0308', '\u0327', '\u20dd', '\u200d', '\ufe0f', '\u00e9', '\u00c9', '\u00df', '\u0130', '\u03a3',
  '\uff21', '\uff41', '\uff10', '\ufb01', '\u2460', '\u00bd', '\u2126', '\u212b', '\u1100', '\u1161', '\u11a8', '\uac00',
  '\u0915', '\u094d', '\u0937', '\u093f', '\u0e01', '\u0e33', '\u6771', '\u4eac', '\u3042', '\u30ab', '\uff76', '\uff9e',
  '\u{1F44D}', '\u{1F3FD}', '\u{1F469}', '\u{1F4BB}', '\u{1F1EB}', '\u{1F1F7}', '\u{1F600}', '\u2603',
  '<0x41>', '[SEP]', '[sep]', '\uff3b\uff33\uff25\uff30\uff3d', '[MASK]', '<unk>', '\u2581', '\u0000', '\u0007',
  '\ud7a3', '\u{10FFFF}',
];
const texts = [];
for (let i = 0; i < count; ++i) {
  const length = 1 + Math.floor(uniform() * 12);
  let s = '';
  for (let k = 0; k < length; ++k) s += alphabet[Math.floor(uniform() * alphabet.length)];
  texts.push(s);
}

(async () => {
  const reference = Tokenizer.fromFile(tokenizerJson);
  const encodings = await reference.encodeBatch(texts, { addSpecialTokens: false });
  const want = encodings.map((e) => JSON.stringify(e.getIds()));
  const input = texts.map((t) => JSON.stringify(t)).join('\n') + '\n';
  const got = execFileSync(dea, ['tokenize', '--spm', model], { input, maxBuffer: 1 << 30 }).toString().split('\n');
  let differences = 0;
  for (let i = 0; i < texts.length; ++i) {
    if (got[i] === want[i]) continue;
    if (++differences <= 10) console.log(`${JSON.stringify(texts[i])}: tokenizers ${want[i]}, dea ${got[i]}`);
  }
  console.log(`spm_differential: ${texts.length} strings, ${differences} differences`);
  process.exit(differences ? 1 : 0);
})();
