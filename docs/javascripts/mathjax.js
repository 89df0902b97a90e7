// MathJax 3 configuration for the notebooks' $...$ and $$...$$ math (loaded from a CDN, see mkdocs.yml).
window.MathJax = {
  tex: {inlineMath: [["$", "$"], ["\\(", "\\)"]], displayMath: [["$$", "$$"], ["\\[", "\\]"]], processEscapes: true}
};
