// treecask: inspect, verify, import and export treecask archives (tool.cc).
#include "commands.h"

int main(int argc, char** argv) { return treecask::cli::run_tool(argc, argv); }
