"""The actor API users call: Actor, @endpoint, adverbs, actor/proc/host meshes,
controllers, Monarch's older entry points and ending the client."""
