"""Code generation: IR -> Python source through jinja2 templates, formatted by black, checked by
libcst."""
