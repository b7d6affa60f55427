// Type-checked (tsc --noEmit, module nodenext) against the installed package's
// declarations: the runtime's and the generated demo client's.
import { Client, InvalidParamsError, RpcError, Tensor, type TensorRef, free, keep } from "ferry-client";
import { DemoClient, type AddParams } from "ferry-client/generated/demo";

export async function sum(addr: string): Promise<number> {
  const client: Client = await Client.connect(addr);
  const demo = new DemoClient(client);
  const params: AddParams = { a: 1, b: 2 };
  const total: number = await demo.add(params, { timeoutMs: 1000 });
  const t: Tensor = await demo.echo({ tensor: Tensor.from([1, 2], [2], "f32") });
  const e: RpcError = new InvalidParamsError(-32602, "x");
  client.close();
  return total + t.numel + e.code;
}

// A remote reference where the generated client takes a tensor.
export async function sumByReference(client: Client): Promise<number> {
  const r: TensorRef = await keep(client, Tensor.from([1, 2], [2], "f32"), { ttlMs: 1000 });
  const total: number = await new DemoClient(client).sum({ tensor: r });
  return total + (await free(client, r));
}
