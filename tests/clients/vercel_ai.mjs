// The Vercel AI SDK's default OpenAI provider (the Responses API) through toolkeeper, unchanged but for
// the base URL: two turns with a tool of its own; prints what the app would read, as JSON.
//   node vercel_ai.mjs BASE_URL
import { generateText, stepCountIs, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { z } from "zod";

const openai = createOpenAI({ baseURL: process.argv[2], apiKey: "sk-vercel-ai" });
const weatherCalls = [];
const tools = {
  get_weather: tool({
    description: "The weather in a city.",
    inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => { weatherCalls.push(city); return `sunny in ${city}`; },
  }),
};

const first = await generateText({
  model: openai("scripted-model"), tools, stopWhen: stepCountIs(5),
  prompt: "What is a fjord, and the weather in Bergen?",
});
const messages = [{ role: "user", content: "What is a fjord, and the weather in Bergen?" },
                  ...first.responseMessages, { role: "user", content: "Thanks!" }];
const second = await generateText({ model: openai("scripted-model"), tools, messages });

console.log(JSON.stringify({ first: first.text, second: second.text, weatherCalls,
                             steps: first.steps.map((s) => s.toolCalls.map((c) => c.toolName)) }));
