// Included first by every kernel: extensions, the C/GLSL shared header, small helpers.
// Every .comp starts: #version 450, #extension GL_GOOGLE_include_directive : require, #include "common.glsl".
#extension GL_EXT_control_flow_attributes : require
#include "vki_shared.h"
