/* Math in answers: $…$ inline and $$…$$ displayed, drawn by KaTeX as MathML (no inline styles,
 * so nothing the page's CSP forbids) while Markdown is parsed. The HTML that comes out is then
 * sanitised with everything else (markdown.js): MathML elements and attributes are on the
 * allow-list, scripts, links and styles inside math are not. */

const { katex, marked } = globalThis;

export const MATH_TAGS = [
  "math", "semantics", "annotation", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "msup", "msub",
  "msubsup", "mfrac", "msqrt", "mroot", "mover", "munder", "munderover", "mtable", "mtr", "mtd",
  "mstyle", "mpadded", "mphantom", "menclose", "merror", "mlabeledtr",
];
export const MATH_ATTR = [
  "display", "displaystyle", "scriptlevel", "mathvariant", "encoding", "stretchy", "fence", "separator",
  "lspace", "rspace", "accent", "accentunder", "columnalign", "rowspacing", "columnspacing", "rowlines",
  "columnlines", "width", "height", "depth", "voffset", "minsize", "maxsize", "movablelimits",
  "linethickness", "notation", "largeop", "symmetric", "mathcolor",
];

const OPTIONS = { output: "mathml", throwOnError: false, trust: false, strict: "ignore", maxSize: 20, maxExpand: 500 };

function tex(source, displayMode) {
  try {
    return katex.renderToString(source, { ...OPTIONS, displayMode });
  } catch (err) {
    const code = document.createElement("code");
    code.textContent = source;
    return code.outerHTML;
  }
}

const inlineMath = {
  name: "inlineMath",
  level: "inline",
  start(src) {
    const at = src.indexOf("$");
    return at < 0 ? undefined : at;
  },
  tokenizer(src) {
    let m = /^\$\$(?!\$)([\s\S]+?)\$\$/.exec(src);
    if (m) return { type: "inlineMath", raw: m[0], text: m[1].trim(), display: true };
    // Not "$5 and $10": no space inside the dollars, and no digit right after the closing one.
    m = /^\$(?![\s$])((?:\\\$|[^$\n])+?)(?<![\s\\])\$(?!\d)/.exec(src);
    if (m) return { type: "inlineMath", raw: m[0], text: m[1], display: false };
    return undefined;
  },
  renderer: (token) => tex(token.text, token.display),
};

const blockMath = {
  name: "blockMath",
  level: "block",
  start(src) {
    const at = src.search(/^ {0,3}\$\$/m);
    return at < 0 ? undefined : at;
  },
  tokenizer(src) {
    const m = /^ {0,3}\$\$([\s\S]+?)\$\$[^\S\n]*(?:\n+|$)/.exec(src);
    if (m) return { type: "blockMath", raw: m[0], text: m[1].trim() };
    return undefined;
  },
  renderer: (token) => `<p>${tex(token.text, true)}</p>\n`,
};

let parser = null;

/** Markdown to (unsanitised) HTML, with math when KaTeX is loaded. */
export function parseWithMath(text) {
  if (!katex || !marked.Marked) return marked.parse(text, { gfm: true, async: false });
  if (!parser) parser = new marked.Marked({ gfm: true, async: false, extensions: [blockMath, inlineMath] });
  return parser.parse(text);
}

export const hasMath = () => Boolean(katex);
