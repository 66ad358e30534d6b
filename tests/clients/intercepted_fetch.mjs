// A Node agent with its vendor's base URL hard-coded: plain fetch, no proxy setting of its own.
const response = await fetch("https://api.model.test/v1/chat/completions", {
  method: "POST",
  headers: { "Content-Type": "application/json", Authorization: "Bearer sk-node-agent" },
  body: JSON.stringify({ model: "m", messages: [{ role: "user", content: process.argv[2] }] }),
});
const body = await response.json();
console.log(JSON.stringify({ status: response.status, content: body.choices?.[0]?.message?.content ?? null }));
