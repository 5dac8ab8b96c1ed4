#!/usr/bin/env node
// The package ships TypeScript sources; tsx compiles them on load.
import { register } from "tsx/esm/api";

register();
await import("../src/cli/main.ts");
