import { h, render } from "preact";
import { App } from "./App.ts";
import "./styles.css";

const root = document.getElementById("app");
if (root) render(h(App, null), root);
