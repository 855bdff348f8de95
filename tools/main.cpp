// The attn command.
#include <CLI/CLI.hpp>
#include <iostream>

#include "attn/attn.hpp"

int main(int argc, char** argv) {
  CLI::App app{"attn: exact, fast attention on CPUs"};
  app.require_subcommand(1);
  app.add_subcommand("demo", "Show the attention process on an embedded example");
  CLI11_PARSE(app, argc, argv);
  std::cout << "attn " << attn::version << "\n";
  return 0;
}
