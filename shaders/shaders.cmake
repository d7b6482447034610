# Every SPIR-V module the library embeds: vki_shader(<blob name> <source> [DEFINE=VALUE...]).
# Data types are #defines; sizes/flags are specialisation constants (see engine/kernels.c).
vki_shader(add add.comp)
