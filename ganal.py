import glob, collections
seen=collections.defaultdict(list); other=[]
for f in sorted(glob.glob("/tmp/h2work/gout/*.txt")):
    for line in open(f):
        if line.startswith("#"):
            if not line.startswith(("#assign","#revoke")): other.append((f,line.strip()[:200]))
            continue
        t,o,v=line.split(); seen[t].append((int(v),int(o),f[-6:-4]))
for t in sorted(seen):
    vals=[v for v,_,_ in seen[t]]; c=collections.Counter(vals)
    d=[(v,n) for v,n in c.items() if n>1]
    print(t,"n",len(vals),"distinct",len(c),"missing",sorted(set(range(max(c)+1))-set(c))[:10],"max",max(c),"dups",len(d), sorted(d)[:8])
print(len(other), other[:10])
