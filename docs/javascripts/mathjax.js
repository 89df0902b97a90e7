// MathJax 3 configuration (loaded from a CDN, see mkdocs.yml): the pages' maths, which pymdownx.arithmatex hands
// over as \(...\) and \[...\], and the notebooks' $...$ and $$...$$.
window.MathJax = {
  tex: {inlineMath: [["$", "$"], ["\\(", "\\)"]], displayMath: [["$$", "$$"], ["\\[", "\\]"]], processEscapes: true}
};
